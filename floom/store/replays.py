"""Tables of replays and evals: which runs replay which recordings, and eval batches."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Text
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class Replay(SQLModel, table=True):
    """A run that replays another run's recording: "exact" (no model, no tool) or "what_if"
    (the model of the replay's version live, tools answered from the recording)."""

    __tablename__ = "replays"
    run_id: str = Field(primary_key=True, max_length=40)
    original_run_id: str = Field(index=True, max_length=40)
    mode: str = Field(max_length=16)
    model: str | None = Field(default=None, max_length=128)
    eval_id: str | None = Field(default=None, index=True, max_length=40)
    # Exact replays: the first step where the replay left the recording (JSON), if any.
    divergence_json: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Eval(SQLModel, table=True):
    """A batch of what-if replays of a worker's recorded runs against one version."""

    __tablename__ = "evals"
    id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(index=True, max_length=63)
    version_id: str = Field(max_length=40)
    model: str | None = Field(default=None, max_length=128)
    selector: str = Field(max_length=400)
    created_by: str | None = Field(default=None, max_length=40)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
