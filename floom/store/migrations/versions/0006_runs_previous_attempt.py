"""runs keep how the attempt before the last one ended

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "previous_attempt", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True
            )
        )
    # A run between attempts at the upgrade said how its last attempt ended in its error code.
    op.execute(
        "UPDATE runs SET previous_attempt = CASE error_code "
        "WHEN 'interrupted' THEN 'interrupted' WHEN 'executor_lost' THEN 'lost' "
        "ELSE 'failed' END "
        "WHERE attempt > 1 AND error_code IS NOT NULL AND status IN ('queued', 'running')"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("previous_attempt")
