"""Triggers, webhook deliveries and the answers to inbound webhooks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import Field

from floom import jsonvalues
from floom.schemas.common import (
    ErrorDetail,
    IsoTime,
    Page,
    Public,
    RunStatusWord,
    Timestamp,
    TriggerKindWord,
)
from floom.schemas.runs import RunPublic

if TYPE_CHECKING:
    from floom.store.models import Worker
    from floom.store.triggers import Trigger, WebhookDelivery


class TriggerPublic(Public):
    """A trigger with its state; schedules add their zone and next fires, webhooks the URL
    to send to and whether their signing secret is set."""

    id: str
    worker: str
    kind: TriggerKindWord
    config: dict[str, Any]
    paused: bool
    worker_paused: bool
    active: bool
    last_fire_at: Timestamp | None
    created_at: Timestamp
    timezone: str | None = None
    next_fires: list[IsoTime] = Field(default_factory=list)
    url: str | None = None
    secret_set: bool | None = None

    omit_when_unset = frozenset({"timezone", "next_fires", "url", "secret_set"})

    @classmethod
    def of(cls, trigger: Trigger, *, worker: Worker, config: dict[str, Any], **extra: Any) -> Self:
        """The trigger of `worker` with its `config`; a schedule's zone and next fires, a
        webhook's URL and whether its secret is set are `extra`."""
        return cls(
            id=trigger.id,
            worker=trigger.worker_name,
            kind=trigger.kind,
            config=config,
            paused=trigger.paused,
            worker_paused=worker.paused,
            active=cls.is_active(trigger, worker),
            last_fire_at=trigger.last_fire_at,
            created_at=trigger.created_at,
            **extra,
        )

    @staticmethod
    def is_active(trigger: Trigger, worker: Worker) -> bool:
        return not (trigger.paused or worker.paused) and trigger.removed_at is None


class TriggerListing(Page[TriggerPublic]):
    worker: str
    paused: bool


class DeliveryPublic(Public):
    id: str
    source: str = Field(json_schema_extra={"enum": ["webhook", "composio"]})
    worker: str = Field(description='"" for a Composio event no worker subscribes to')
    trigger_id: str | None
    delivery_id: str = Field(description="the sender's own id for the delivery")
    event: str | None
    received_at: Timestamp
    outcome: str
    message: str | None
    run_id: str | None
    replay_count: int
    size: int
    content_type: str

    @classmethod
    def of(cls, delivery: WebhookDelivery, **extra: Any) -> Self:
        return cls(
            id=delivery.id,
            source=delivery.source,
            worker=delivery.worker_name,
            trigger_id=delivery.trigger_id,
            delivery_id=delivery.delivery_key,
            event=delivery.event,
            received_at=delivery.received_at,
            outcome=delivery.outcome,
            message=delivery.message,
            run_id=delivery.run_id,
            replay_count=delivery.replay_count,
            size=len(delivery.body),
            content_type=delivery.content_type,
            **extra,
        )


class DeliveryDetail(DeliveryPublic):
    headers: dict[str, Any]
    body: str

    @classmethod
    def of_stored(cls, delivery: WebhookDelivery) -> Self:
        """The delivery with its stored headers and body."""
        return cls.of(
            delivery,
            headers=jsonvalues.stored(delivery.headers_json, expect=dict),
            body=delivery.body.decode("utf-8", errors="replace"),
        )


class HookAnswer(Public):
    """What a webhook's sender is told; with `?wait=` and a run that ended in time, also the
    run's status, outputs and error."""

    delivery_id: str = Field(
        description="floom's id of the stored delivery: its `id` in the worker's deliveries, "
        "the one POST /deliveries/{id}/replay takes (the sender's own id is its `delivery_id`)"
    )
    worker: str | None
    outcome: str
    run_id: str | None = Field(
        description="the run the delivery started, or the skipped run stored for a delivery "
        "that was refused (a paused worker, inputs that do not fit)"
    )
    duplicate: bool
    message: str | None
    status: RunStatusWord | None = None
    outputs: dict[str, Any] | None = None
    error: Any = None
    run: RunPublic | None = None

    omit_when_unset = frozenset({"status", "outputs", "error", "run"})


class HookRefusal(Public):
    """A refusal; `delivery` is there when the delivery was recorded (bad inputs, a paused
    worker), so its sender can find it again."""

    error: ErrorDetail
    delivery: HookAnswer | None = None

    omit_when_unset = frozenset({"delivery"})


class ComposioAnswer(Public):
    duplicate: bool
    deliveries: list[HookAnswer]
