"""held_back_logs: ended runs whose later lines cannot be merged into their earlier log (its
object missing or damaged), kept so /healthz, /metrics, `floom doctor` and
`floom blobs held-back` count and list them without reading the bucket

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 22:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

import floom.store.models

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "held_back_logs",
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("problem", sqlmodel.sql.sqltypes.AutoString(length=1000), nullable=False),
        sa.Column("since", floom.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )


def downgrade() -> None:
    # Before it, held-back logs are found by reading the bucket: the next upkeep pass passes
    # them over again, so nothing is lost with the table.
    op.drop_table("held_back_logs")
