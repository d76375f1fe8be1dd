"""runs carry a lease epoch, the fencing token of their attempts' writes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 10:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every row starts at epoch 0. A node older than this revision neither bumps nor checks
    # the epoch: in a cluster upgraded one node at a time, the fence holds once all are.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("lease_epoch", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("lease_epoch")
