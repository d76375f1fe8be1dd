"""Webhook deliveries: verified, stored without credentials, deduplicated on their delivery
id, turned into a run (or a skipped run when paused), listed per worker and replayable."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, insert, literal, null, or_
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import (
    BodyTooSlow,
    Conflict,
    FloomError,
    InputInvalid,
    NotFound,
    PayloadTooLarge,
    RunErrorCode,
    StoreUnavailable,
    WorkerPaused,
    quoted,
)
from floom.hints import act, told
from floom.services import paging
from floom.services.access import principal, secrets
from floom.services.alerts import callbacks
from floom.services.ops import deliveries as delivery_retention
from floom.services.runs import lifecycle as runs
from floom.services.triggers.registry import spec_of
from floom.services.workers import exposure
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, UTCDateTime, Worker, new_id
from floom.store.triggers import DeliveryTombstone, Trigger, WebhookDelivery
from floom.triggers import signatures
from floom.triggers.spec import EVENT_INPUT, ComposioSpec, WebhookSpec, callback_origin
from floom.vocabulary import RunTrigger, TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

# A delivery's outcome: it started a run, or it did not (its skipped run's error code), or it
# matched no worker.
RUN = "run"
PAUSED = RunErrorCode.PAUSED
INPUT_INVALID = RunErrorCode.INPUT_INVALID
START_FAILED = RunErrorCode.START_FAILED
UNMATCHED = "unmatched"

log = logging.getLogger("floom.webhooks")


# A secret name no secret has (names are checked when set), looked up for a hook that is not
# there or not ready, so that its refusal costs what a real one does.
DECOY_SECRET = "floom decoy: no secret has this name"
DECOY_KEY = b"floom decoy key, verifies nothing"


def refuse_unverified(ctx: Context, *, headers: Mapping[str, str], body: bytes) -> FloomError:
    """The refusal of a request no webhook's secret verifies, at the cost of one that was
    checked: a secret looked up and the body's HMAC computed, so that neither the answer nor,
    as far as it goes, its time tells a sender whether a webhook is there."""
    secrets.resolve(ctx, [DECOY_SECRET])
    hmac.new(DECOY_KEY, body, hashlib.sha256).digest()
    return signatures.refusal(headers)


@dataclass
class Received:
    """A delivery as answered to its sender."""

    delivery: WebhookDelivery
    duplicate: bool = False
    error: FloomError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def receive_webhook(
    ctx: Context,
    *,
    worker_name: str,
    headers: Mapping[str, str],
    body: bytes,
    callback_url: str | None = None,
) -> Received:
    """Verify a delivery to /hooks/{worker} and start its run.

    Refusals (too large; then, the one answer of refuse_unverified: unsigned, a signature
    that does not match, no webhook here or not ready; for a verified sender only: stale, a
    callback URL that cannot be used) raise and store nothing. A delivery id seen before returns the
    stored delivery, marked duplicate. The run's record goes to `callback_url` when it ends.
    """
    check_size(ctx, body)
    path = f"/hooks/{worker_name}"
    found = _webhook_trigger(ctx, worker_name)
    if found is None:
        raise refuse_unverified(ctx, headers=headers, body=body)
    trigger, worker = found
    spec = spec_of(trigger)
    if not isinstance(spec, WebhookSpec):  # a stored row that cannot be read: no webhook
        raise refuse_unverified(ctx, headers=headers, body=body)
    values, missing = secrets.resolve(ctx, [spec.secret])
    if missing:
        log.warning(
            "refused a delivery to %s: its webhook cannot verify deliveries until the "
            "secret %s is set (`floom secrets set %s`)",
            path,
            spec.secret,
            spec.secret,
        )
        raise refuse_unverified(ctx, headers=headers, body=body)
    secret = values[spec.secret]
    weak = signatures.standard_key_problem(secret) if spec.signature == "standard" else None
    if weak is not None:
        log.warning(
            "refused a delivery to %s: the secret %s is not a Standard Webhooks key "
            "(%s); set it to %s (`floom secrets set %s`)",
            path,
            spec.secret,
            weak,
            signatures.STANDARD_KEY_FORM,
            spec.secret,
        )
        raise refuse_unverified(ctx, headers=headers, body=body)
    try:
        verified = signatures.verify(spec.signature, secret=secret, headers=headers, body=body)
    except (signatures.WebhookUnsigned, signatures.WebhookSignatureInvalid) as exc:
        log.info("refused a delivery to %s (%s signature): %s", path, spec.signature, exc.message)
        raise signatures.refusal(headers) from None
    lower = {k.lower(): v for k, v in headers.items()}
    event_name = lower.get("x-github-event") or lower.get("x-floom-event")
    # Only a verified sender may have floom connect anywhere (the name is resolved here),
    # and only to an origin worker.yml lists: the query is not signed.
    callback = callbacks.check_callback_url(ctx, allowed_callback(spec, callback_url))
    return deliver(
        ctx,
        source=RunTrigger.WEBHOOK,
        key=verified.delivery_id,
        digest=verified.signature_digest,
        trigger=trigger,
        worker=worker,
        headers=headers,
        body=body,
        event_name=event_name,
        redact=[secret],
        callback_url=callback,
    )


def allowed_callback(spec: WebhookSpec, url: str | None) -> str | None:
    """A delivery's `?callback_url=`, refused (InputInvalid) unless the webhook's `callbacks`
    in worker.yml list its origin. No signature scheme signs a request's query, so one
    altered in flight, or sent again, must not choose where a run's record goes."""
    if url is None:
        return None
    origin = callback_origin(url)
    if origin is not None and origin in spec.callbacks:
        return url
    shown = f"'{quoted(origin or url)}'"
    if not spec.callbacks:
        said = f"callback_url: this webhook names no callback origins, so {shown} is refused"
    else:
        allowed = ", ".join(spec.callbacks)
        said = f"callback_url: {shown} is not an origin this webhook lists ({allowed})"
    raise InputInvalid(
        said,
        hint="list the origin in worker.yml (triggers: - webhook: {..., callbacks: "
        "[https://ci.example.com]}) and deploy, or leave callback_url out",
        details=[{"path": "callback_url", "message": said}],
    )


def check_size(ctx: Context, body: bytes) -> None:
    limit = ctx.settings.webhook_max_bytes
    if len(body) > limit:
        raise payload_too_large(limit)


def payload_too_large(limit: int) -> PayloadTooLarge:
    # The sender is anonymous: the setting that raises the limit is named only in the log.
    log.warning("refused a webhook body over %d bytes (FLOOM_WEBHOOK_MAX_BYTES)", limit)
    return PayloadTooLarge(
        f"the webhook body is larger than {limit} bytes", hint="send a smaller payload"
    )


def body_too_slow(seconds: float) -> BodyTooSlow:
    # The sender is anonymous: the setting that raises the deadline is named only in the log.
    log.warning("refused a webhook body not sent within %g s (FLOOM_WEBHOOK_BODY_SECONDS)", seconds)
    return BodyTooSlow(
        f"the webhook body did not arrive within {seconds:g} seconds",
        hint="send the whole body at once",
    )


def deliver(
    ctx: Context,
    *,
    source: RunTrigger,
    key: str,
    trigger: Trigger,
    worker: Worker,
    headers: Mapping[str, str],
    body: bytes,
    event_name: str | None,
    redact: list[str],
    digest: str | None = None,
    callback_url: str | None = None,
) -> Received:
    """Store a verified delivery for one worker and start its run, exactly once per key
    (and per signature digest, when given)."""
    seen = _find(ctx, source=source, worker_name=worker.name, key=key, digest=digest)
    if seen is not None:
        return Received(seen, duplicate=True)
    buried = _tombstone(ctx, source=source, worker_name=worker.name, key=key, digest=digest)
    if buried is not None:
        return Received(buried, duplicate=True)
    redactor = secrets.Redactor(redact)
    stored_headers = {k: redactor.text(v) for k, v in signatures.storable_headers(headers).items()}
    spec = spec_of(trigger)
    assert isinstance(spec, WebhookSpec | ComposioSpec)
    delivery = WebhookDelivery(
        id=new_id("dlv"),
        source=source,
        worker_name=worker.name,
        trigger_id=trigger.id,
        delivery_key=key[:200],
        signature_digest=digest,
        event=(event_name or "")[:200] or None,
        headers_json=json.dumps(stored_headers, sort_keys=True),
        body=redact_bytes(body, redact),
        content_type=stored_headers.get("content-type", "")[:200],
        outcome=RUN,
        # The scheme `trigger` verified it with, read with it: what it says later may differ.
        signature=spec.signature if isinstance(spec, WebhookSpec) else None,
    )
    try:
        if trigger.paused or worker.paused:
            what = "this trigger" if trigger.paused else f"worker '{worker.name}'"
            raise WorkerPaused(f"{what} is paused")
        inputs = event_inputs(
            ctx, worker=worker, spec=spec, body=body, content_type=_ctype(headers)
        )

        def record(s: Session, run: Run) -> None:
            run.trigger_id = trigger.id
            delivery.run_id = run.id
            s.add(delivery)
            s.flush()  # the dedupe key: fails if the same delivery raced in

        runs.create_run(
            ctx,
            worker_name=worker.name,
            inputs=inputs,
            trigger=source,
            caller=principal.SYSTEM,
            in_transaction=callbacks.recorder(callback_url, record),
        )
        return Received(delivery)
    except IntegrityError:
        again = _find(ctx, source=source, worker_name=worker.name, key=key, digest=digest)
        if again is None:
            raise
        return Received(again, duplicate=True)
    except WorkerPaused as exc:
        return _refused(ctx, delivery, PAUSED, exc.message, trigger=source, error=None)
    except InputInvalid as exc:
        return _refused(ctx, delivery, INPUT_INVALID, exc.message, trigger=source, error=exc)
    except StoreUnavailable:
        # Not this delivery's fault, nor lasting (another node holds the worker's row, or the
        # database is away): a 503 the sender retries, not a start written off as failed.
        raise
    except FloomError as exc:
        return _refused(ctx, delivery, START_FAILED, exc.message, trigger=source, error=exc)


def _refused(
    ctx: Context,
    delivery: WebhookDelivery,
    outcome: RunErrorCode,
    message: str,
    *,
    trigger: RunTrigger,
    error: FloomError | None,
) -> Received:
    """Keep a delivery that did not start a run, with a skipped run saying why."""
    delivery.outcome = outcome
    delivery.message = message
    try:
        with session_scope(ctx.engine, write=True) as s:
            worker = s.get(Worker, delivery.worker_name)
            delivery.run_id = new_id("run")
            s.add(delivery)
            s.flush()  # the dedupe key, before the run that names it
            runs.insert_skipped_run(
                s,
                run_id=delivery.run_id,
                worker_name=delivery.worker_name,
                version_id=worker.active_version_id if worker else None,
                trigger=trigger,
                trigger_id=delivery.trigger_id,
                code=outcome,
                reason=message,
                error_message=f"delivery {delivery.id}: {message}",
            )
    except IntegrityError:
        again = _find(
            ctx,
            source=delivery.source,
            worker_name=delivery.worker_name,
            key=delivery.delivery_key,
            digest=delivery.signature_digest,
        )
        if again is None:
            raise
        return Received(again, duplicate=True)
    return Received(delivery, error=error)


def _find(
    ctx: Context, *, source: str, worker_name: str, key: str, digest: str | None = None
) -> WebhookDelivery | None:
    same = col(WebhookDelivery.delivery_key) == key[:200]
    if digest:
        same = or_(same, col(WebhookDelivery.signature_digest) == digest)
    with session_scope(ctx.engine) as s:
        return s.exec(
            select(WebhookDelivery).where(
                WebhookDelivery.source == source, WebhookDelivery.worker_name == worker_name, same
            )
        ).first()


def _tombstone(
    ctx: Context, *, source: str, worker_name: str, key: str, digest: str | None
) -> WebhookDelivery | None:
    """A delivery with this key or digest whose record went (with a deleted worker of this
    name, or by retention: floom/services/ops/deliveries.py), as its sender was answered."""
    keys = [key[:200], *([digest] if digest else [])]
    with session_scope(ctx.engine) as s:
        row = s.exec(
            select(DeliveryTombstone).where(
                DeliveryTombstone.source == source,
                DeliveryTombstone.worker_name == worker_name,
                col(DeliveryTombstone.key).in_(keys),
            )
        ).first()
    if row is None:
        return None
    return WebhookDelivery(
        id=row.delivery_id,
        source=row.source,
        worker_name=row.worker_name,
        delivery_key=key[:200],
        run_id=row.run_id,
        outcome=row.outcome,
        received_at=row.received_at,
        message="received before, and its record is gone (its worker was deleted, or "
        "retention removed it); not run again",
    )


def keep_tombstones(s: Session, *, worker_name: str, now: datetime) -> None:
    """Before a worker's triggers and deliveries are deleted (with the worker): keep their
    keys and signature digests, so none of them runs again under a worker deployed with the
    name. A key whose signature is timestamped (Composio's, a webhook's whose scheme signs
    one) expires KEY_GRACE after `now`; the others are kept for good
    (floom/services/ops/deliveries.py)."""
    d = WebhookDelivery.__table__  # type: ignore[attr-defined]
    t = DeliveryTombstone.__table__  # type: ignore[attr-defined]
    ids = s.exec(select(Trigger.id).where(Trigger.worker_name == worker_name)).all()
    expires = case(
        (
            delivery_retention.signed_with_timestamp(
                d, delivery_retention.timestamped_triggers(s, ids)
            ),
            literal(now + delivery_retention.KEY_GRACE, UTCDateTime()),
        ),
        else_=null(),
    )
    for key in (d.c.delivery_key, d.c.signature_digest):
        buried = (
            sa_select(t.c.id)
            .where(t.c.source == d.c.source, t.c.worker_name == d.c.worker_name, t.c.key == key)
            .exists()
        )
        rows = sa_select(
            d.c.source,
            d.c.worker_name,
            key,
            d.c.id,
            d.c.run_id,
            d.c.outcome,
            d.c.received_at,
            expires,
        ).where(d.c.worker_name == worker_name, key.is_not(None), ~buried)
        if key is d.c.signature_digest:  # a digest that is the key too is kept once
            rows = rows.where(d.c.signature_digest != d.c.delivery_key)
        columns = ["source", "worker_name", "key", "delivery_id", "run_id", "outcome"]
        s.execute(insert(t).from_select([*columns, "received_at", "expires_at"], rows))


def _webhook_trigger(ctx: Context, worker_name: str) -> tuple[Trigger, Worker] | None:
    with session_scope(ctx.engine) as s:
        worker = s.get(Worker, worker_name)
        trigger = s.exec(
            select(Trigger).where(
                Trigger.worker_name == worker_name,
                Trigger.kind == TriggerKind.WEBHOOK,
                col(Trigger.removed_at).is_(None),
            )
        ).first()
    if worker is None or trigger is None or worker.active_version_id is None:
        return None
    return trigger, worker


# -- the event as inputs -----------------------------------------------------------------------


def parse_body(body: bytes, content_type: str) -> Any:
    """JSON when the body is JSON (also GitHub's form-encoded `payload=`), else its text."""
    text = body.decode("utf-8", errors="replace")
    if "application/x-www-form-urlencoded" in content_type:
        form = urllib.parse.parse_qs(text)
        if "payload" in form:
            text = form["payload"][0]
    value, breach = jsonvalues.parse(text, where="the body")
    if breach is None:
        return value
    if breach.limit == "json":
        return text
    raise InputInvalid(
        f"{breach.message} ({breach.limit} bound)",
        hint=jsonvalues.bounds_hint(),
        details=[breach.detail()],
    )


def event_inputs(
    ctx: Context,
    *,
    worker: Worker,
    spec: WebhookSpec | ComposioSpec,
    body: bytes,
    content_type: str,
) -> dict[str, Any]:
    """The run's inputs: the body as `event` (if declared) and the mapped body fields."""
    version = workers.get_version(
        ctx, version_id=worker.active_version_id or "", caller=principal.SYSTEM
    )
    manifest = workers.manifest_of(version)
    parsed = parse_body(body, content_type)
    inputs: dict[str, Any] = {}
    declared = manifest.inputs.get(EVENT_INPUT)
    if declared is not None:
        if declared.type == "string":
            inputs[EVENT_INPUT] = parsed if isinstance(parsed, str) else json.dumps(parsed)
        else:
            inputs[EVENT_INPUT] = parsed
    for name, path in spec.inputs.items():
        if name in manifest.inputs:
            inputs[name] = lookup(parsed, path)
    return inputs


def lookup(value: Any, path: str) -> Any:
    """The value at a dotted path (keys, or list indexes) of parsed JSON; None if absent."""
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _ctype(headers: Mapping[str, str]) -> str:
    return {k.lower(): v for k, v in headers.items()}.get("content-type", "")


def redact_bytes(body: bytes, values: list[str]) -> bytes:
    for value in values:
        if value and value.encode() in body:
            body = body.replace(value.encode(), secrets.REDACTED.encode())
    return body


# -- listing and replaying ---------------------------------------------------------------------


def list_deliveries(
    ctx: Context,
    *,
    worker_name: str,
    cursor: str | None = None,
    limit: int = 50,
    caller: principal.Principal,
) -> tuple[list[WebhookDelivery], str | None]:
    """A worker's deliveries, newest first; `cursor` is the last id of the previous page.
    Needs the read scope."""
    workers.get_worker(ctx, name=worker_name, caller=caller)
    paging.check_limit(limit)
    q = (
        select(WebhookDelivery)
        .where(WebhookDelivery.worker_name == worker_name)
        .order_by(col(WebhookDelivery.id).desc())
        .limit(limit + 1)
    )
    if cursor := paging.id_cursor(cursor, prefix="dlv"):
        q = q.where(col(WebhookDelivery.id) < cursor)
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(q).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor


def get_delivery(ctx: Context, *, delivery_id: str, caller: principal.Principal) -> WebhookDelivery:
    """One delivery with its headers and body. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        delivery = s.get(WebhookDelivery, delivery_id)
    if delivery is None:
        raise NotFound(
            f"no delivery {quoted(delivery_id)}",
            hint=told(act("deliveries", worker="WORKER"), " lists a worker's"),
        )
    return delivery


def replay_delivery(
    ctx: Context, *, delivery_id: str, caller: principal.Principal, force: bool = False
) -> Run:
    """Run a stored delivery again, as a new run (trigger `replay`) on the active version,
    with its inputs taken from the stored body by the trigger's current settings. Needs the
    run scope; the deploy scope for a delivery that came while its trigger (or worker) was
    paused or whose trigger is paused now (exposure.check_delivery_replay)."""
    caller.require("run")
    delivery = get_delivery(ctx, delivery_id=delivery_id, caller=caller)
    if not delivery.worker_name:
        raise Conflict(
            f"delivery {delivery_id} matched no worker, so there is nothing to run again",
            hint="deploy a worker whose composio trigger matches the event, then send it again",
        )
    with session_scope(ctx.engine) as s:
        trigger = s.get(Trigger, delivery.trigger_id) if delivery.trigger_id else None
    worker = workers.get_worker(ctx, name=delivery.worker_name, caller=caller)
    if trigger is None:
        raise NotFound(f"the trigger of delivery {delivery_id} no longer exists")
    came_paused = delivery.outcome == PAUSED
    exposure.check_delivery_replay(
        worker_name=delivery.worker_name,
        delivery_id=delivery.id,
        came_paused=came_paused,
        trigger_paused=trigger.paused,
        caller=caller,
    )
    spec = spec_of(trigger)
    if not isinstance(spec, WebhookSpec | ComposioSpec):
        raise Conflict(
            f"the trigger of delivery {delivery_id} is stored in a form floom cannot read",
            hint=f"deploy worker {delivery.worker_name} again, then replay the delivery",
        )
    inputs = event_inputs(
        ctx, worker=worker, spec=spec, body=delivery.body, content_type=delivery.content_type
    )

    def record(s: Session, run: Run) -> None:
        # Read again, locked, where the run is queued: a pause committed since is seen, and
        # one committing now waits for the run to be queued (or refused).
        current = s.get(Trigger, trigger.id, with_for_update=True, populate_existing=True)
        exposure.check_delivery_replay(
            worker_name=delivery.worker_name,
            delivery_id=delivery.id,
            came_paused=came_paused,
            trigger_paused=current is not None and current.paused,
            caller=caller,
            s=s,
        )
        run.trigger_id = trigger.id
        row = s.get(WebhookDelivery, delivery.id)
        if row is not None:
            row.replay_count += 1
            s.add(row)

    return runs.create_run(
        ctx,
        worker_name=delivery.worker_name,
        inputs=inputs,
        trigger=RunTrigger.REPLAY,
        caller=caller,
        replay_of=delivery.run_id,
        force=force,
        in_transaction=record,
    )
