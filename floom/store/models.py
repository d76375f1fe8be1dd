"""floom's tables. The runs table is also the queue."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic_core import PydanticUndefined
from sqlalchemy import Column, DateTime, Index, LargeBinary, Text, TypeDecorator, UniqueConstraint
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored as UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


_id_lock = threading.Lock()
_last_micros = 0


def new_id(prefix: str) -> str:
    """Time-sortable id: a microsecond clock, strictly increasing within a process, then
    randomness; so ids order by creation and serve as the queue's order and page cursors."""
    global _last_micros
    with _id_lock:
        _last_micros = max(int(time.time() * 1_000_000), _last_micros + 1)
        micros = _last_micros
    return f"{prefix}_{micros:014x}{os.urandom(4).hex()}"


M = TypeVar("M", bound=SQLModel)

# Per table class: each field's default, as (name, value or factory, is it a factory).
_defaults: dict[type[Any], list[tuple[str, Any, bool]]] = {}


def trusted_row(model: type[M], values: Mapping[Any, Any]) -> M:
    """A new (transient) `model` holding `values`, the rest at their declared defaults: the
    same object `model(**values)` makes, built as SQLAlchemy builds a loaded row, without the
    instrumented setattr of each field (`Run(**row)` costs ~130 us, this ~10 us). For values
    floom wrote or read itself: a table model validates nothing either way, and `values`
    must name fields of the table only."""
    defaults = _defaults.get(model)
    if defaults is None:
        defaults = _defaults[model] = [
            (name, field.default_factory or field.default, field.default_factory is not None)
            for name, field in model.model_fields.items()
            if field.default_factory is not None or field.default is not PydanticUndefined
        ]
    row: M = model._sa_class_manager.new_instance()  # type: ignore[attr-defined]
    data = row.__dict__
    for name, default, factory in defaults:
        if name not in values:
            data[name] = default() if factory else default
    data.update(values)
    return row


class Blob(SQLModel, table=True):
    """Content-addressed bytes: version archives and artifacts."""

    __tablename__ = "blobs"
    digest: str = Field(primary_key=True, max_length=64)
    size: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Worker(SQLModel, table=True):
    __tablename__ = "workers"
    name: str = Field(primary_key=True, max_length=63)
    active_version_id: str | None = Field(default=None, max_length=40)
    paused: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # The worker's current state version (0: none yet): the compare-and-set token every write
    # of its state moves by one (services/workers/state.py).
    state_version: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class Version(SQLModel, table=True):
    __tablename__ = "versions"
    __table_args__ = (UniqueConstraint("worker_name", "digest"),)
    id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(index=True, max_length=63)
    digest: str = Field(max_length=64)
    manifest_json: str = Field(sa_column=Column(Text, nullable=False))
    manifest_yaml: str = Field(sa_column=Column(Text, nullable=False))
    kind: str = Field(max_length=16)
    file_count: int
    size: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    deployed_by: str | None = Field(default=None, max_length=40)


class Run(SQLModel, table=True):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_queue", "status", "not_before"),
        Index("ix_runs_worker", "worker_name", "id"),
        Index("ix_runs_lease", "status", "lease_expires_at"),
    )
    id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(max_length=63)
    version_id: str = Field(max_length=40)
    status: str = Field(max_length=24)
    trigger: str = Field(default="manual", max_length=16)
    inputs_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    outputs_json: str | None = Field(default=None, sa_column=Column(Text))
    error_code: str | None = Field(default=None, max_length=40)
    error_message: str | None = Field(default=None, sa_column=Column(Text))
    exit_code: int | None = None
    attempt: int = 1
    max_attempts: int = 1
    # How the attempt before this one ended (interrupted, lost, failed); kept once the run
    # ends, while error_code then says how the run ended.
    previous_attempt: str | None = Field(default=None, max_length=16)
    concurrency: int | None = None
    replay_of: str | None = Field(default=None, max_length=40)
    retry_of: str | None = Field(default=None, max_length=40)
    scheduled_for: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The trigger (floom/store/triggers.py) that started the run, if one did.
    trigger_id: str | None = Field(default=None, max_length=40, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    not_before: datetime | None = Field(default=None, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    lease_owner: str | None = Field(default=None, max_length=80)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The fencing token of the run's lease: one more at each claim and each reap, so every
    # write of an attempt presents the epoch it was claimed with and a fenced (older)
    # attempt's writes match nothing (floom/engine/queue.py).
    lease_epoch: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    cancel_requested: bool = False
    sandbox_seconds: float = 0.0
    created_by: str | None = Field(default=None, max_length=40)
    # "apply" after a run-level approval, "resume" after a tool-call decision; None at first.
    phase: str | None = Field(default=None, max_length=16)
    parent_run_id: str | None = Field(default=None, max_length=40, index=True)
    # The worker state version the run started from (0: none yet), for a worker with
    # `state:`; a replay is created holding its original's, and starts from that.
    state_base: int | None = None


class WorkerState(SQLModel, table=True):
    """One version of a worker's state: what it held, who wrote it, from which run."""

    __tablename__ = "worker_states"
    worker_name: str = Field(primary_key=True, max_length=63)
    version: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    state_json: str = Field(sa_column=Column(Text, nullable=False))
    size: int
    # "run" (a run's success), "operator" (set by a person or key) or "restore" (an earlier
    # version brought back, `restored_from`).
    source: str = Field(max_length=16)
    written_by: str | None = Field(default=None, max_length=80)
    run_id: str | None = Field(default=None, max_length=40)
    restored_from: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RunEvent(SQLModel, table=True):
    """One log line (or system notice) of a run, ordered by seq within the run."""

    __tablename__ = "run_events"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(max_length=40)
    seq: int
    attempt: int = 1
    ts: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    stream: str = Field(max_length=8)
    line: str = Field(sa_column=Column(Text, nullable=False))


class Artifact(SQLModel, table=True):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("run_id", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True, max_length=40)
    name: str = Field(max_length=512)
    size: int
    # Indexed: purging asks which blobs any artifact still refers to.
    digest: str = Field(max_length=64, index=True)
    content_type: str = Field(max_length=128)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Secret(SQLModel, table=True):
    __tablename__ = "secrets"
    name: str = Field(primary_key=True, max_length=128)
    ciphertext: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"
    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(default="", max_length=128)
    prefix: str = Field(max_length=16)
    key_hash: str = Field(unique=True, max_length=64)
    scopes: str = Field(max_length=128)
    # The handoff agent this key speaks for; its roles are read per request, never cached.
    agent_id: str | None = Field(default=None, max_length=40, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
