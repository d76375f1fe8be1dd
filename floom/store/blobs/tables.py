"""Tables of blob storage: ended runs' logs kept as one blob each, and the object store's
pending work (uploads and deletes that wait for it to answer)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class RunLog(SQLModel, table=True):
    """The log of an ended run, moved out of run_events into one compressed blob (JSON lines,
    gzip; floom/store/blobs/logs.py) when new blobs go to object storage."""

    __tablename__ = "run_logs"
    run_id: str = Field(primary_key=True, max_length=40)
    # Indexed: reclaiming asks which blobs run logs still refer to.
    digest: str = Field(max_length=64, index=True)
    lines: int
    last_seq: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class PendingBlob(SQLModel, table=True):
    """Work on the object store that waits for it to answer: an "upload" of a blob whose
    bytes the database holds meanwhile (the store was away when it was stored), or a
    "delete" of the object of a blob that is gone. Durable: it survives a restart."""

    __tablename__ = "blob_pending"
    digest: str = Field(primary_key=True, max_length=64)
    action: str = Field(max_length=8)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    attempts: int = 0


class HeldBack(SQLModel, table=True):
    """An ended run whose later lines (in run_events) cannot be merged into its earlier log,
    whose object is missing or damaged, as the upkeep's pass found it
    (services/ops/held_logs.py). It counts only while the run's run_logs row still names
    `digest`: a move that replaced it, or a run pruned, leaves a row that counts for nothing
    until it is tidied."""

    __tablename__ = "held_back_logs"
    run_id: str = Field(primary_key=True, max_length=40)
    digest: str = Field(max_length=64)
    problem: str = Field(max_length=1000)
    since: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
