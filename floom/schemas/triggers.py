"""Triggers, webhook deliveries and the answers to inbound webhooks."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from floom.errors import FloomError
from floom.hints.surface import tell
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
from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.runs.rules import SKIPPED
from floom.services.triggers import registry as triggers
from floom.services.triggers import webhooks
from floom.store.triggers import WebhookDelivery


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


class DeliveryDetail(DeliveryPublic):
    headers: dict[str, Any]
    body: str


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


# -- builders -----------------------------------------------------------------------------------


def trigger_listing(
    ctx: Context, *, name: str, urls: triggers.HookUrls, caller: Principal
) -> TriggerListing:
    worker, rows = triggers.list_triggers(ctx, worker_name=name, caller=caller)
    items = [
        TriggerPublic.model_validate(triggers.trigger_to_dict(ctx, t, worker=worker, urls=urls))
        for t in rows
    ]
    return TriggerListing(worker=name, paused=worker.paused, items=items, next_cursor=None)


def delivery_public(delivery: WebhookDelivery) -> DeliveryPublic:
    return DeliveryPublic.model_validate(webhooks.delivery_to_dict(delivery))


def delivery_detail(ctx: Context, *, delivery_id: str, caller: Principal) -> DeliveryDetail:
    delivery = webhooks.get_delivery(ctx, delivery_id=delivery_id, caller=caller)
    return DeliveryDetail.model_validate(webhooks.delivery_to_dict(delivery, with_body=True))


def hook_answer(received: webhooks.Received) -> HookAnswer:
    d = received.delivery
    answer = HookAnswer(
        delivery_id=d.id,
        worker=d.worker_name or None,
        outcome=d.outcome,
        # A refused delivery is stored with a skipped run saying why: the sender gets its id.
        run_id=d.run_id,
        duplicate=received.duplicate,
        message=d.message,
    )
    if d.run_id and d.outcome != webhooks.RUN:
        answer.status = SKIPPED
    return answer


def hook_refusal(error: FloomError, answer: HookAnswer) -> HookRefusal:
    # A webhook's sender is a plain REST client: it is told REST requests, not floom commands.
    body = error.to_dict()
    for field in ("message", "hint"):
        body[field] = tell(body[field], surface="rest")
    return HookRefusal(error=ErrorDetail.model_validate(body), delivery=answer)
