"""webhook_deliveries.signature: the scheme that verified a delivery, so how long its key
must guard is decided by its own signature and not by its trigger's scheme at the time
(a redeploy changes a webhook's scheme in place); NULL for Composio's and older rows

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("signature", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True)
        )


def downgrade() -> None:
    # The schema before decides from the trigger's scheme: rows lose what verified them,
    # which only makes retention keep fewer tombstones of a webhook whose scheme changed.
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_column("signature")
