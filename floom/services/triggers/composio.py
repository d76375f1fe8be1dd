"""Composio trigger events at /hooks/composio: verified as Standard Webhooks with the
server's COMPOSIO_WEBHOOK_SECRET, deduplicated on `webhook-id`, matched to workers by event
slug, connected account and filters, and delivered as each worker's `event` input.

Payload shapes read (as Composio documents them):

- V3: {"id", "type": "composio.trigger.message", "timestamp",
       "metadata": {"trigger_slug", "trigger_id", "connected_account_id", "user_id", ...},
       "data": {...}}
- V2: {"type": "<trigger slug, lower case>", "timestamp",
       "data": {..., "connection_id", "connection_nano_id", "trigger_id"}}
- V1: {"trigger_name", "connection_id", "trigger_id", "payload": {...}}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from floom.errors import InvalidRequest
from floom.services.access import secrets
from floom.services.triggers.registry import spec_of
from floom.services.triggers.webhooks import (
    UNMATCHED,
    Received,
    check_size,
    deliver,
    lookup,
    parse_body,
    redact_bytes,
    refuse_unverified,
)
from floom.store.db import session_scope
from floom.store.models import Worker, new_id
from floom.store.triggers import Trigger, WebhookDelivery
from floom.triggers import signatures
from floom.triggers.spec import ComposioSpec
from floom.vocabulary import RunTrigger, TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

V3_TYPE = "composio.trigger.message"

log = logging.getLogger("floom.webhooks")


@dataclass(frozen=True)
class ComposioEvent:
    slug: str
    connected_account: str | None
    data: Any


def read_event(payload: Any) -> ComposioEvent | None:
    """The slug, connected account and data of a trigger event; None for other events."""
    if not isinstance(payload, Mapping):
        return None
    metadata = payload.get("metadata")
    if payload.get("type") == V3_TYPE and isinstance(metadata, Mapping):
        slug = metadata.get("trigger_slug")
        account = metadata.get("connected_account_id")
        data = payload.get("data")
    elif isinstance(payload.get("trigger_name"), str):
        slug = payload["trigger_name"]
        account = payload.get("connection_id")
        data = payload.get("payload")
    elif isinstance(payload.get("type"), str) and isinstance(payload.get("data"), Mapping):
        slug = payload["type"]
        data = payload["data"]
        account = data.get("connection_nano_id") or data.get("connection_id")
    else:
        return None
    if not isinstance(slug, str) or not slug:
        return None
    return ComposioEvent(
        slug=slug.upper(), connected_account=str(account) if account else None, data=data
    )


def matches(spec: ComposioSpec, event: ComposioEvent) -> bool:
    if spec.event != event.slug:
        return False
    if spec.connected_account and spec.connected_account != event.connected_account:
        return False
    for path, wanted in spec.filters.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        value = lookup(event.data, path)
        if not any(_same(value, option) for option in options):
            return False
    return True


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(value, bool) or isinstance(wanted, bool):
        return value is wanted
    if isinstance(value, int | float) and isinstance(wanted, int | float):
        return value == wanted
    return value is not None and str(value) == str(wanted)


def receive_composio(ctx: Context, *, headers: Mapping[str, str], body: bytes) -> list[Received]:
    """Verify one Composio delivery and start a run for each worker whose trigger matches
    and has not run it yet.

    An event that matches no worker is stored as unmatched, so it is not lost.
    """
    check_size(ctx, body)
    secret = ctx.settings.composio_webhook_secret
    if not secret:
        log.warning(
            "refused a delivery to /hooks/composio: set FLOOM_COMPOSIO_WEBHOOK_SECRET to the "
            "secret of your Composio webhook subscription and restart floom"
        )
        raise refuse_unverified(ctx, headers=headers, body=body)
    weak = signatures.standard_key_problem(secret)
    if weak is not None:
        log.warning(
            "refused a delivery to /hooks/composio: FLOOM_COMPOSIO_WEBHOOK_SECRET is not a "
            "Standard Webhooks key (%s); set it to the secret of your Composio webhook "
            "subscription and restart floom",
            weak,
        )
        raise refuse_unverified(ctx, headers=headers, body=body)
    try:
        key = signatures.verify_standard(secret=secret, headers=headers, body=body)
    except (signatures.WebhookUnsigned, signatures.WebhookSignatureInvalid) as exc:
        log.info("refused a delivery to /hooks/composio: %s", exc.message)
        raise signatures.refusal(headers) from None
    # Exactly once per event and worker, not per event: a delivery cut short after firing
    # some of its workers (a crash, a failed start) is sent again by Composio, and the
    # workers not fired yet must run then; deliver() acknowledges the ones that did.
    seen = _seen(ctx, key)
    if any(d.outcome == UNMATCHED for d in seen):  # handled whole: it matched no worker
        return [Received(d, duplicate=True) for d in seen]
    payload = parse_body(body, "application/json")
    if not isinstance(payload, Mapping):
        raise InvalidRequest("a Composio event must be a JSON object")
    event = read_event(payload)
    results = []
    for trigger, worker in _candidates(ctx):
        spec = spec_of(trigger)
        if event is None or not isinstance(spec, ComposioSpec) or not matches(spec, event):
            continue
        results.append(
            deliver(
                ctx,
                source=RunTrigger.COMPOSIO,
                key=key,
                trigger=trigger,
                worker=worker,
                headers=headers,
                body=body,
                event_name=event.slug,
                redact=[secret],
                callback_url=spec.callback_url,
            )
        )
    if not results and seen:  # its workers' triggers are gone since: nothing runs now
        return [Received(d, duplicate=True) for d in seen]
    if not results:
        results.append(_unmatched(ctx, key, headers, body, event, redact=[secret]))
    return results


def _seen(ctx: Context, key: str) -> list[WebhookDelivery]:
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(WebhookDelivery).where(
                    WebhookDelivery.source == RunTrigger.COMPOSIO,
                    WebhookDelivery.delivery_key == key[:200],
                )
            ).all()
        )


def _candidates(ctx: Context) -> list[tuple[Trigger, Worker]]:
    with session_scope(ctx.engine) as s:
        return [
            (t, w)
            for t, w in s.exec(
                select(Trigger, Worker)
                .join(Worker, col(Worker.name) == col(Trigger.worker_name))
                .where(
                    Trigger.kind == TriggerKind.COMPOSIO,
                    col(Trigger.removed_at).is_(None),
                    col(Worker.active_version_id).is_not(None),
                )
                .order_by(col(Trigger.worker_name))
            ).all()
        ]


def _unmatched(
    ctx: Context,
    key: str,
    headers: Mapping[str, str],
    body: bytes,
    event: ComposioEvent | None,
    *,
    redact: list[str],
) -> Received:
    """Stored as a matched delivery is: the headers and body with `redact` (the webhook's
    secret) masked."""
    redactor = secrets.Redactor(redact)
    delivery = WebhookDelivery(
        id=new_id("dlv"),
        source=RunTrigger.COMPOSIO,
        worker_name="",
        delivery_key=key[:200],
        event=event.slug[:200] if event else None,
        headers_json=json.dumps(
            {k: redactor.text(v) for k, v in signatures.storable_headers(headers).items()},
            sort_keys=True,
        ),
        body=redact_bytes(body, redact),
        outcome=UNMATCHED,
        message="no worker's composio trigger matches this event",
    )
    try:
        with session_scope(ctx.engine, write=True) as s:
            s.add(delivery)
    except IntegrityError:
        return Received(_seen(ctx, key)[0], duplicate=True)
    return Received(delivery)
