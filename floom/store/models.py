"""floom's tables. The runs table is also the queue."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from pydantic_core import PydanticUndefined
from sqlalchemy import (
    Column,
    DateTime,
    Index,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import configure_mappers
from sqlmodel import Field, SQLModel

from floom.errors import RunErrorCode
from floom.vocabulary import (
    ChannelKind,
    DeliveryPurpose,
    DeliveryStatus,
    PreviousAttempt,
    RunStatus,
    RunTrigger,
)


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


W = TypeVar("W", bound=StrEnum)


class Words(TypeDecorator[W]):
    """A word of one of floom's closed sets (floom/vocabulary.py) in a VARCHAR(length): the
    schema of a plain string column (no native enum, no CHECK), read back as the enum's
    member. A word this floom does not know (a newer node's) is read as the string it is."""

    impl = String
    cache_ok = True

    def __init__(self, words: type[W], length: int) -> None:
        super().__init__(length=length)
        self.words = words
        self.length = length
        self._members: dict[object, Any] = {word.value: word for word in words}

    def process_bind_param(self, value: W | None, dialect: Any) -> str | None:
        return None if value is None else str.__str__(value)

    def process_result_value(self, value: object, dialect: Any) -> W | None:
        if value is None:
            return None
        word: W = self._members.get(value, value)
        return word


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
        # The mappers are configured by the first ORM query of a process; a row built before
        # any (a command whose first read is a Core one) had no attribute implementations,
        # and reading a field raised AttributeError.
        configure_mappers()
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
    """Content-addressed bytes: version archives, artifacts, agent workspaces, ended runs'
    logs. The row is the blob's index entry wherever its bytes live (floom/store/blobs/)."""

    __tablename__ = "blobs"
    digest: str = Field(primary_key=True, max_length=64)
    size: int
    # The bytes when `location` is "database"; empty when a bucket holds them.
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Which blob store holds the bytes: "database" or "s3".
    location: str = Field(
        default="database", max_length=16, sa_column_kwargs={"server_default": "database"}
    )
    # The sha256 of the bytes, checked at every read (a version's digest is over its folder,
    # not its archive's bytes); None only for blobs stored before floom kept it.
    sha256: str | None = Field(default=None, max_length=64)


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
        # The alert watch reads the runs that ended since it last looked.
        Index("ix_runs_finished", "finished_at"),
    )
    id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(max_length=63)
    version_id: str = Field(max_length=40)
    status: RunStatus = Field(sa_type=Words(RunStatus, 24))
    trigger: RunTrigger = Field(default=RunTrigger.MANUAL, sa_type=Words(RunTrigger, 16))
    inputs_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    outputs_json: str | None = Field(default=None, sa_column=Column(Text))
    error_code: RunErrorCode | None = Field(default=None, sa_type=Words(RunErrorCode, 40))
    error_message: str | None = Field(default=None, sa_column=Column(Text))
    exit_code: int | None = None
    attempt: int = 1
    max_attempts: int = 1
    # How the attempt before this one ended (interrupted, lost, failed); kept once the run
    # ends, while error_code then says how the run ended.
    previous_attempt: PreviousAttempt | None = Field(
        default=None, sa_type=Words(PreviousAttempt, 16)
    )
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


# -- alerts and run callbacks (floom/services/alerts/) -----------------------------------------


class AlertChannel(SQLModel, table=True):
    """Where alerts go: an outbound webhook, a Slack-compatible incoming webhook or email.
    `config_json` holds no credential: it names the secrets that hold them."""

    __tablename__ = "alert_channels"
    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(unique=True, max_length=63)
    kind: ChannelKind = Field(sa_type=Words(ChannelKind, 16))
    config_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AlertRule(SQLModel, table=True):
    """A global rule: which events (of one worker, or of all) go to which channels. Per-worker
    rules live in the worker's worker.yml (`alerts:`) and are read from its active version."""

    __tablename__ = "alert_rules"
    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(unique=True, max_length=63)
    worker_name: str | None = Field(default=None, max_length=63)  # None: every worker
    events_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    channels_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    recovery: bool = True
    enabled: bool = True
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AlertIncident(SQLModel, table=True):
    """Something that went wrong and has not recovered: its first event alerts, the ones after
    it are grouped into it, and its recovery alerts once. `open_key` is its subject while it
    is open (unique: one open incident per subject, whichever node saw it first) and None
    once it is closed."""

    __tablename__ = "alert_incidents"
    id: str = Field(primary_key=True, max_length=40)
    subject: str = Field(max_length=200, index=True)
    open_key: str | None = Field(default=None, max_length=200, unique=True)
    kind: str = Field(max_length=40)  # the opening event's kind
    worker_name: str | None = Field(default=None, max_length=63)
    events: int = 1
    opened_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_event_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    closed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class AlertEvent(SQLModel, table=True):
    """One thing the alert watch saw, once: `key` names it (a run's end, a schedule's tick),
    so every node that sees it again records nothing."""

    __tablename__ = "alert_events"
    id: str = Field(primary_key=True, max_length=40)
    key: str = Field(unique=True, max_length=200)
    kind: str = Field(max_length=40)
    subject: str = Field(max_length=200)
    worker_name: str | None = Field(default=None, max_length=63)
    run_id: str | None = Field(default=None, max_length=40)
    incident_id: str | None = Field(default=None, max_length=40)
    # opened, grouped, recovered or notice (an event outside any incident)
    outcome: str = Field(max_length=16)
    error_code: str | None = Field(default=None, max_length=40)
    message: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Delivery(SQLModel, table=True):
    """One message floom sends out: an alert to a channel, a test alert, or a run's callback.
    Durable and retried with backoff under a lease, so a node that dies mid-send leaves it to
    another (or to itself, restarted); exactly one success is recorded."""

    __tablename__ = "deliveries"
    __table_args__ = (Index("ix_deliveries_due", "status", "next_attempt_at"),)
    id: str = Field(primary_key=True, max_length=40)
    purpose: DeliveryPurpose = Field(sa_type=Words(DeliveryPurpose, 16))
    event_id: str | None = Field(default=None, max_length=40, index=True)
    run_id: str | None = Field(default=None, max_length=40, index=True)
    channel_id: str | None = Field(default=None, max_length=40)
    channel_name: str | None = Field(default=None, max_length=63)
    # A callback's URL (alerts read theirs from the channel).
    target: str | None = Field(default=None, sa_column=Column(Text))
    body_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    status: DeliveryStatus = Field(sa_type=Words(DeliveryStatus, 16))
    attempts: int = 0
    max_attempts: int = 1
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    lease_owner: str | None = Field(default=None, max_length=80)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class RunCallback(SQLModel, table=True):
    """A URL whoever started the run asked floom to POST its record to when it ends; stored
    in the run's queueing transaction, turned into a delivery once the run has ended."""

    __tablename__ = "run_callbacks"
    run_id: str = Field(primary_key=True, max_length=40)
    url: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    delivery_id: str | None = Field(default=None, max_length=40, index=True)


class AlertCursor(SQLModel, table=True):
    """How far the alert watch has read a stream of changes (ended runs, webhook deliveries)."""

    __tablename__ = "alert_cursors"
    name: str = Field(primary_key=True, max_length=40)
    at: datetime = Field(sa_type=UTCDateTime)


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
