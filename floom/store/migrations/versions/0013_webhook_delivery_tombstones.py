"""webhook_delivery_tombstones: the delivery keys of a deleted worker's deliveries, so a
worker deployed again under its name does not run them when they are sent again

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 04:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

from floom.store.models import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_delivery_tombstones",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("worker_name", sqlmodel.sql.sqltypes.AutoString(length=63), nullable=False),
        sa.Column("key", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("delivery_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True),
        sa.Column("outcome", sqlmodel.sql.sqltypes.AutoString(length=24), nullable=False),
        sa.Column("received_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("source", "worker_name", "key"),
    )


def downgrade() -> None:
    op.drop_table("webhook_delivery_tombstones")
