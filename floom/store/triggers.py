"""Tables of triggers: the synced triggers, each schedule fire (the exactly-once key), and the
stored webhook and Composio deliveries."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, Words, utcnow
from floom.vocabulary import TriggerKind


class Trigger(SQLModel, table=True):
    """One trigger of a worker, as synced from the active version's worker.yml.

    `key` is a hash of the trigger's identity (for a schedule: cron and timezone), so a
    redeploy that keeps the trigger keeps this row, its id and its last fire.
    """

    __tablename__ = "triggers"
    __table_args__ = (UniqueConstraint("worker_name", "key"),)
    id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(index=True, max_length=63)
    kind: TriggerKind = Field(sa_type=Words(TriggerKind, 16))
    key: str = Field(max_length=64)
    position: int = 0
    config_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    paused: bool = False
    # The latest scheduled time handled (fired, skipped or recorded as missed).
    last_fire_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    removed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class TriggerFire(SQLModel, table=True):
    """A schedule's tick, handled once: whichever scheduler inserts this row first owns it."""

    __tablename__ = "trigger_fires"
    __table_args__ = (UniqueConstraint("trigger_id", "scheduled_for"),)
    id: int | None = Field(default=None, primary_key=True)
    trigger_id: str = Field(max_length=40)
    scheduled_for: datetime = Field(sa_type=UTCDateTime)
    outcome: str = Field(max_length=16)  # run, overlap_skip, missed, paused, error
    run_id: str | None = Field(default=None, max_length=40)
    node_id: str = Field(default="", max_length=80)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class WebhookDelivery(SQLModel, table=True):
    """A verified delivery, stored without credentials so it can be listed and replayed.

    `delivery_key` is the sender's delivery id (or a digest of its signature), unique per
    source and worker: a delivery seen before is acknowledged and not run again. Where the
    sender's id is not signed, `signature_digest` is unique too, so a captured request sent
    again under a new id is a duplicate as well.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("source", "worker_name", "delivery_key"),
        UniqueConstraint("source", "worker_name", "signature_digest"),
        Index("ix_webhook_deliveries_worker", "worker_name", "id"),
    )
    id: str = Field(primary_key=True, max_length=40)
    source: str = Field(max_length=16)  # webhook, composio
    worker_name: str = Field(default="", max_length=63)  # "" for an unmatched Composio event
    trigger_id: str | None = Field(default=None, max_length=40)
    delivery_key: str = Field(max_length=200)
    signature_digest: str | None = Field(default=None, max_length=64)
    event: str | None = Field(default=None, max_length=200)
    headers_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    body: bytes = Field(default=b"", sa_column=Column(LargeBinary, nullable=False))
    content_type: str = Field(default="", max_length=200)
    received_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    run_id: str | None = Field(default=None, max_length=40)
    outcome: str = Field(max_length=24)  # run, paused, input_invalid, unmatched
    message: str | None = Field(default=None, sa_column=Column(Text))
    replay_count: int = 0
    # The scheme that verified it (standard, github, hmac-sha256): how long its key must
    # guard is its own signature's, not what its trigger says later (a redeploy changes a
    # webhook's scheme in place). None for Composio's (always timestamped) and for those
    # stored before it was kept.
    signature: str | None = Field(default=None, max_length=16)


class DeliveryTombstone(SQLModel, table=True):
    """A delivery key (or signature digest) kept when its delivery goes (with its worker, or
    by retention): a captured delivery sent again must not run. A timestamped signature's
    key (Standard Webhooks, floom's hmac-sha256, Composio) guards only until `expires_at`,
    past its signature's window and senders' retries, and retention prunes it then
    (floom/services/ops/deliveries.py). GitHub signs no timestamp, so its deliveries can be
    sent again for as long as their secret stands: their tombstones have none and are kept, a
    few bytes each (as are those stored before the expiry was, whose scheme is not known)."""

    __tablename__ = "webhook_delivery_tombstones"
    __table_args__ = (UniqueConstraint("source", "worker_name", "key"),)
    id: int | None = Field(default=None, primary_key=True)
    source: str = Field(max_length=16)
    worker_name: str = Field(max_length=63)
    key: str = Field(max_length=200)
    delivery_id: str = Field(max_length=40)
    run_id: str | None = Field(default=None, max_length=40)
    outcome: str = Field(max_length=24)
    received_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
