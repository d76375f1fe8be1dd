"""What the alert watch saw, recorded once, grouped into incidents, and turned into deliveries.

A problem (a failed run, a missed tick, a lost node) opens an incident for its subject
("worker:NAME", "schedule:TRIGGER", "trigger:TRIGGER", "node:ID") and alerts; further
problems of that subject while it is open are grouped into it and send nothing; the
subject's recovery closes it and alerts once more. A notice (a run waiting for approval)
alerts on its own. Each event's key makes it count once, whichever node saw it first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.manifest.alerts import EVENTS, RECOVERED
from floom.services.access import secrets
from floom.services.alerts import rules
from floom.services.workers import versions as workers
from floom.store.db import database_now, session_scope
from floom.store.models import (
    AlertChannel,
    AlertEvent,
    AlertIncident,
    Delivery,
    Secret,
    Version,
    Worker,
    new_id,
)
from floom.vocabulary import DeliveryPurpose, DeliveryStatus

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.alerts")

PROBLEM = "problem"
RECOVERY = "recovery"
NOTICE = "notice"
MAX_MESSAGE = 2000
PENDING = DeliveryStatus.PENDING
THROTTLED = DeliveryStatus.THROTTLED


@dataclass
class Seen:
    """One thing the watch saw. `key` makes it count once (a recovery's is made from its
    incident); `at` is when it happened."""

    key: str
    kind: str
    subject: str
    what: str  # PROBLEM, RECOVERY or NOTICE
    summary: str
    at: datetime
    worker: str | None = None
    run_id: str | None = None
    error_code: str | None = None
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def record(ctx: Context, seen: Seen) -> AlertEvent | None:
    """Record `seen` and queue its alerts, in one transaction; None when it was recorded
    before (by this node or another) or is a recovery with no open incident."""
    for _ in range(2):  # a second pass when another node opened the same incident meanwhile
        try:
            with session_scope(ctx.engine, write=True) as s:
                return _record(ctx, s, seen)
        except IntegrityError:
            if _exists(ctx, seen.key):
                return None
    return None


def _exists(ctx: Context, key: str) -> bool:
    with session_scope(ctx.engine) as s:
        return s.exec(select(AlertEvent.id).where(AlertEvent.key == key)).first() is not None


def known_keys(s: Session, keys: list[str]) -> set[str]:
    """Which of `keys` were recorded already (so a pass skips them without a write)."""
    if not keys:
        return set()
    return set(s.exec(select(AlertEvent.key).where(col(AlertEvent.key).in_(keys))).all())


def open_subjects(s: Session, prefix: str) -> dict[str, AlertIncident]:
    rows = s.exec(select(AlertIncident).where(col(AlertIncident.open_key).startswith(prefix))).all()
    return {row.subject: row for row in rows}


def _record(ctx: Context, s: Session, seen: Seen) -> AlertEvent | None:
    if s.exec(select(AlertEvent.id).where(AlertEvent.key == seen.key)).first() is not None:
        return None
    incident = s.exec(
        select(AlertIncident).where(AlertIncident.open_key == seen.subject).with_for_update()
    ).first()
    kind, outcome = seen.kind, NOTICE
    routes: list[rules.Route] = []
    if seen.what == RECOVERY:
        if incident is None or seen.at < incident.opened_at:
            return None
        incident.open_key = None
        incident.closed_at = seen.at
        s.add(incident)
        kind, outcome = RECOVERED, "recovered"
        seen.key = f"{seen.subject}:recovered:{incident.id}"
        routes = [
            r for r in rules.routes_for(s, kind=incident.kind, worker=seen.worker) if r.recovery
        ]
    elif seen.what == PROBLEM:
        if incident is not None:
            incident.events += 1
            incident.last_event_at = seen.at
            s.add(incident)
            outcome = "grouped"
        else:
            incident = AlertIncident(
                id=new_id("inc"),
                subject=seen.subject,
                open_key=seen.subject,
                kind=seen.kind,
                worker_name=seen.worker,
                opened_at=seen.at,
                last_event_at=seen.at,
            )
            s.add(incident)
            s.flush()  # one open incident per subject: fails here if another node opened it
            outcome = "opened"
            routes = rules.routes_for(s, kind=seen.kind, worker=seen.worker)
    else:
        incident = None
        routes = rules.routes_for(s, kind=seen.kind, worker=seen.worker)
    message = _redacted(ctx, s, seen.worker, seen.message)
    event = AlertEvent(
        id=new_id("aev"),
        key=seen.key[:200],
        kind=kind,
        subject=seen.subject[:200],
        worker_name=seen.worker,
        run_id=seen.run_id,
        incident_id=incident.id if incident else None,
        outcome=outcome,
        error_code=seen.error_code,
        message=message,
        created_at=seen.at,
    )
    s.add(event)
    s.flush()
    if routes:
        body = alert_body(
            ctx, event, seen, incident, summary=_redacted(ctx, s, seen.worker, seen.summary)
        )
        for route in routes:
            enqueue(
                ctx,
                s,
                purpose=DeliveryPurpose.ALERT,
                body=body,
                channel=route.channel,
                event_id=event.id,
                run_id=seen.run_id,
            )
    return event


def alert_body(
    ctx: Context,
    event: AlertEvent,
    seen: Seen,
    incident: AlertIncident | None,
    *,
    summary: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": event.kind,
        "event_id": event.id,
        "timestamp": event.created_at.isoformat(),
        "summary": summary or "",
        "about": EVENTS.get(event.kind, "an incident recovered" if event.kind == RECOVERED else ""),
        "subject": event.subject,
        "worker": event.worker_name,
        "run_id": event.run_id,
        "run_url": run_url(ctx, event.run_id) if event.run_id else None,
        "error": {"code": event.error_code, "message": event.message}
        if event.error_code or event.message
        else None,
        "details": seen.details,
    }
    if incident is not None:
        body["incident"] = {
            "id": incident.id,
            "kind": incident.kind,
            "status": "recovered" if incident.closed_at else "open",
            "opened_at": incident.opened_at.isoformat(),
            "events": incident.events,
        }
    return body


def run_url(ctx: Context, run_id: str) -> str:
    settings = ctx.settings
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    return f"{base.rstrip('/')}/runs/{run_id}"


def _redacted(ctx: Context, s: Session, worker: str | None, text: str | None) -> str | None:
    """`text` bounded, with the values of the worker's declared secrets masked, as its logs
    are (an error message may quote what the worker was given)."""
    if text is None:
        return None
    if worker is None:
        return text[:MAX_MESSAGE]
    row = s.exec(
        select(Version)
        .join(Worker, col(Worker.active_version_id) == col(Version.id))
        .where(Worker.name == worker)
    ).first()
    if row is None:
        return text[:MAX_MESSAGE]
    try:
        manifest = workers.manifest_of(row)
    except workers.ManifestUnreadable:
        # Which secrets it declares cannot be read: mask every secret floom holds.
        names = list(s.exec(select(Secret.name)).all())
    else:
        names = [*manifest.secrets, *manifest.apply_secrets]
    if not names:
        return text[:MAX_MESSAGE]
    values, _ = secrets.resolve(ctx, names, s=s)
    # Masked before it is cut, and a secret's beginning left at the cut masked too (as a
    # long log line is): a cut through a secret would leave its first characters.
    redactor = secrets.Redactor(values.values())
    masked = redactor.text(text)
    return masked if len(masked) <= MAX_MESSAGE else redactor.cut_tail(masked[:MAX_MESSAGE])


def enqueue(
    ctx: Context,
    s: Session,
    *,
    purpose: DeliveryPurpose,
    body: dict[str, Any],
    channel: AlertChannel | None = None,
    target: str | None = None,
    event_id: str | None = None,
    run_id: str | None = None,
    max_attempts: int | None = None,
    due_in: float = 0.0,
) -> Delivery:
    """Add a delivery in the caller's transaction, due at once (or in `due_in` seconds). An
    alert to a channel that has sent its FLOOM_ALERT_THROTTLE_COUNT in the window is kept as
    throttled instead. Due on the database's clock, as deliveries are claimed."""
    now = database_now(s)
    status = PENDING
    if purpose == DeliveryPurpose.ALERT and channel is not None:
        since = now - timedelta(seconds=ctx.settings.alert_throttle_seconds)
        sent = s.exec(
            select(func.count())
            .select_from(Delivery)
            .where(
                Delivery.channel_id == channel.id,
                Delivery.purpose == DeliveryPurpose.ALERT,
                col(Delivery.created_at) >= since,
                Delivery.status != THROTTLED,
            )
        ).one()
        if sent >= ctx.settings.alert_throttle_count:
            status = THROTTLED
    delivery = Delivery(
        id=new_id("dlv"),
        purpose=purpose,
        event_id=event_id,
        run_id=run_id,
        channel_id=channel.id if channel else None,
        channel_name=channel.name if channel else None,
        target=target,
        body_json=jsonvalues.dumps(body, where="body"),
        status=status,
        max_attempts=max_attempts or ctx.settings.alert_max_attempts,
        next_attempt_at=now + timedelta(seconds=due_in),
        created_at=now,
    )
    if status == THROTTLED:
        delivery.last_error = (
            f"throttled: channel {channel.name if channel else ''} sent "
            f"{ctx.settings.alert_throttle_count} alerts in the last "
            f"{ctx.settings.alert_throttle_seconds:g}s; re-send it to send it anyway"
        )
    s.add(delivery)
    return delivery


def list_events(ctx: Context, *, limit: int = 50) -> list[AlertEvent]:
    """The latest events, newest first (a rule of the watch's; surfaces list deliveries)."""
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(select(AlertEvent).order_by(col(AlertEvent.id).desc()).limit(limit)).all()
        )


def body_of(delivery: Delivery) -> dict[str, Any]:
    value: dict[str, Any] = jsonvalues.stored(delivery.body_json, expect=dict)
    return value
