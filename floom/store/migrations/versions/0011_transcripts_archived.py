"""agent transcripts archived: an ended agent run's record moved into its log's blob

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from floom.store.blobs.downgrade import restore_agent_records

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agent_transcripts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    # The archived transcripts get their text and tool calls back from their log blobs (the
    # schema before knows no other place), or the downgrade is refused, changing nothing.
    restore_agent_records(op.get_bind())
    with op.batch_alter_table("agent_transcripts", schema=None) as batch_op:
        batch_op.drop_column("archived")
