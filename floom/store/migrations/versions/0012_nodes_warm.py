"""nodes.warm: each node's warm pools as its last heartbeat saw them, so `floom nodes`
shows every node's pools, not only the answering node's

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 19:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("warm", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("warm")
