"""Triggers, webhook deliveries and the answers to inbound webhooks."""

from __future__ import annotations

from typing import Any

from floom import jsonvalues
from floom.errors import FloomError
from floom.hints.surface import render
from floom.schemas.common import ErrorDetail
from floom.schemas.triggers import (
    DeliveryDetail,
    HookAnswer,
    HookRefusal,
    TriggerListing,
    TriggerPublic,
)
from floom.services.access import secrets
from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.runs.rules import SKIPPED
from floom.services.triggers import registry as triggers
from floom.services.triggers import webhooks
from floom.store.models import Worker
from floom.store.triggers import Trigger
from floom.triggers.spec import ScheduleSpec, WebhookSpec, spec_to_config


def trigger_public(
    ctx: Context,
    trigger: Trigger,
    *,
    worker: Worker,
    urls: triggers.HookUrls | None = None,
    count: int = triggers.NEXT_FIRES_SHOWN,
) -> TriggerPublic:
    """A trigger with its state: a schedule's zone and next `count` fires, a webhook's URL and
    whether its signing secret is set."""
    spec = triggers.spec_of(trigger)
    extra: dict[str, Any] = {}
    if isinstance(spec, ScheduleSpec):
        extra["timezone"] = spec.timezone
        # A paused schedule (or one of a paused worker) fires never, so it has no next fires.
        active = TriggerPublic.is_active(trigger, worker)
        fires = triggers.next_fire_times(spec, count=count) if active else []
        extra["next_fires"] = [t.isoformat() for t in fires]
    if isinstance(spec, WebhookSpec):
        extra["url"] = urls.worker(trigger.worker_name) if urls else f"/hooks/{trigger.worker_name}"
        _, missing = secrets.resolve(ctx, [spec.secret])
        extra["secret_set"] = not missing
    config = (
        spec_to_config(spec)
        if spec is not None
        else jsonvalues.unreadable("this trigger's stored config cannot be read; redeploy")
    )
    return TriggerPublic.of(trigger, worker=worker, config=config, **extra)


def trigger_listing(
    ctx: Context, *, name: str, urls: triggers.HookUrls, caller: Principal
) -> TriggerListing:
    worker, rows = triggers.list_triggers(ctx, worker_name=name, caller=caller)
    items = [trigger_public(ctx, t, worker=worker, urls=urls) for t in rows]
    return TriggerListing(worker=name, paused=worker.paused, items=items, next_cursor=None)


def delivery_detail(ctx: Context, *, delivery_id: str, caller: Principal) -> DeliveryDetail:
    delivery = webhooks.get_delivery(ctx, delivery_id=delivery_id, caller=caller)
    return DeliveryDetail.of_stored(delivery)


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
    body["message"] = render(error.said, surface="rest")
    body["hint"] = render(error.advice, surface="rest")
    if error.details is not None:
        body["details"] = error.details_for(lambda told: render(told, surface="rest"))
    return HookRefusal(error=ErrorDetail.model_validate(body), delivery=answer)
