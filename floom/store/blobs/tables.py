"""Tables of blob storage: ended runs' logs kept as one blob each, and the object store's
pending work (uploads and deletes that wait for it to answer)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, text
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class RunLog(SQLModel, table=True):
    """The log of an ended run, moved out of run_events into one compressed blob (JSON lines,
    gzip; floom/store/blobs/logs.py) when new blobs go to object storage."""

    __tablename__ = "run_logs"
    # Partial: only held-back logs are in it, so /healthz and /metrics count them cheaply.
    __table_args__ = (
        Index(
            "ix_run_logs_held_back",
            "run_id",
            sqlite_where=text("held_back IS NOT NULL"),
            postgresql_where=text("held_back IS NOT NULL"),
        ),
    )
    run_id: str = Field(primary_key=True, max_length=40)
    # Indexed: reclaiming asks which blobs run logs still refer to.
    digest: str = Field(max_length=64, index=True)
    lines: int
    last_seq: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Why the run's later lines (in run_events) cannot be merged into this blob, as the last
    # upkeep pass found (its object missing or damaged), or NULL: set by objects.archive_logs,
    # cleared by the move that replaces the row, or given up (objects.give_up_held_logs).
    held_back: str | None = Field(default=None, max_length=1000)


class PendingBlob(SQLModel, table=True):
    """Work on the object store that waits for it to answer: an "upload" of a blob whose
    bytes the database holds meanwhile (the store was away when it was stored), or a
    "delete" of the object of a blob that is gone. Durable: it survives a restart."""

    __tablename__ = "blob_pending"
    digest: str = Field(primary_key=True, max_length=64)
    action: str = Field(max_length=8)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    attempts: int = 0
