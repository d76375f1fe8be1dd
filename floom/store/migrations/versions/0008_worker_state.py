"""worker state: its versions, the worker's current version, and each run's base version

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 12:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

import floom.store.models

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_states",
        sa.Column("worker_name", sqlmodel.sql.sqltypes.AutoString(length=63), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("written_by", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=True),
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True),
        sa.Column("restored_from", sa.Integer(), nullable=True),
        sa.Column("created_at", floom.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_name", "version"),
    )
    # Every worker starts with no state (version 0); runs from before have no base.
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("state_version", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("state_base", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("state_base")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("state_version")
    op.drop_table("worker_states")
