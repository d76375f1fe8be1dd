"""nodes.heard_at: a node's last heartbeat on the database's clock, so a node whose own
clock is off is neither taken for lost nor has what it writes skipped by the alert watch;
ix_approvals_decided: the watch's probe counts decisions since its anchor

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import floom.store.models

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("heard_at", floom.store.models.UTCDateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.create_index("ix_approvals_decided", ["decided_at"], unique=False)


def downgrade() -> None:
    # Before it, silence is judged by each node's own clock, and the probe does not count
    # decisions: nothing is lost, the column is dropped.
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.drop_index("ix_approvals_decided")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("heard_at")
