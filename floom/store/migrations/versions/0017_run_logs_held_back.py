"""run_logs.held_back: why an ended run's later lines cannot be merged into its log (its
object missing or damaged), kept so /healthz, /metrics, `floom doctor` and
`floom blobs held-back` count and list such runs without reading the bucket;
ix_run_logs_held_back holds only those rows

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 22:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("held_back", sqlmodel.sql.sqltypes.AutoString(length=1000), nullable=True))
        batch_op.create_index(
            "ix_run_logs_held_back",
            ["run_id"],
            unique=False,
            sqlite_where=sa.text("held_back IS NOT NULL"),
            postgresql_where=sa.text("held_back IS NOT NULL"),
        )


def downgrade() -> None:
    # Before it, held-back logs are found by reading the bucket: the next upkeep pass passes
    # them over again, so nothing is lost with the column.
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.drop_index("ix_run_logs_held_back")
        batch_op.drop_column("held_back")
