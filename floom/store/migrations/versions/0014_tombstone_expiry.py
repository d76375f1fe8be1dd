"""webhook_delivery_tombstones.expires_at: when a tombstone's key guards nothing any more (a
timestamped signature's window past), so retention prunes it; NULL keeps it (GitHub's)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from floom.store.models import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_delivery_tombstones", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # The schema before keeps every tombstone for good: dropping the expiry loses nothing
    # replay protection needs.
    with op.batch_alter_table("webhook_delivery_tombstones", schema=None) as batch_op:
        batch_op.drop_column("expires_at")
