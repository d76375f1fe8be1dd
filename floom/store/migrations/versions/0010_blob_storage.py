"""blob storage: where each blob's bytes live and their sha256, ended runs' logs as blobs, and
the object store's pending uploads and deletes

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

import floom.store.models
from floom.store.blobs.downgrade import restore_logs

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every blob stored so far is a row of the database; its sha256 is filled in when
    # `floom blobs migrate` moves it.
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "location",
                sqlmodel.sql.sqltypes.AutoString(length=16),
                nullable=False,
                server_default="database",
            )
        )
        batch_op.add_column(
            sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True)
        )
    op.create_table(
        "run_logs",
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", floom.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_logs_digest"), ["digest"], unique=False)
    op.create_table(
        "blob_pending",
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("action", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("created_at", floom.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )


def downgrade() -> None:
    # Ended runs' logs go back into run_events (the schema before keeps them there), or the
    # downgrade is refused, changing nothing (while blobs are in object storage).
    restore_logs(op.get_bind())
    op.drop_table("blob_pending")
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_logs_digest"))
    op.drop_table("run_logs")
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.drop_column("sha256")
        batch_op.drop_column("location")
