"""Deliveries: claimed under a lease (so a node that dies mid-send leaves them to another, or to
itself restarted), sent, and recorded; a failure is tried again after a backoff that doubles,
up to FLOOM_ALERT_MAX_ATTEMPTS. A result is written only while the lease it was sent under
still holds and the delivery is still pending, so exactly one success is recorded."""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, func, or_, update
from sqlmodel import col, select

from floom.errors import Conflict, InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.services import paging
from floom.services.access.principal import Principal
from floom.services.alerts import incidents
from floom.services.alerts.channels import Channel, get_channel
from floom.services.alerts.senders import AlertUndeliverable, send_alert, send_callback
from floom.store.db import database_now, db_now, session_scope
from floom.store.models import AlertChannel, Delivery, new_id, utcnow
from floom.vocabulary import DeliveryPurpose, DeliveryStatus

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.alerts")

STATUSES: tuple[DeliveryStatus, ...] = tuple(DeliveryStatus)
PURPOSES: tuple[DeliveryPurpose, ...] = tuple(DeliveryPurpose)
MAX_BACKOFF_SECONDS = 3600.0
CLAIM_BATCH = 20


def _lease_seconds(ctx: Context) -> float:
    # Longer than one send can take (connect, TLS, the answer), so a live node keeps it.
    return ctx.settings.alert_timeout_seconds * 3 + 5


def receiver_of(delivery: Delivery) -> str:
    """Who receives it: its channel, or its callback's URL (sends to one go one at a time)."""
    return delivery.channel_id or delivery.target or ""


def claim_due(
    ctx: Context,
    *,
    limit: int = CLAIM_BATCH,
    only: str | None = None,
    besides: Collection[str] = (),
    callbacks: bool | None = None,
) -> list[Delivery]:
    """Take up to `limit` due deliveries (or the one `only`) under this node's lease, none to
    a receiver in `besides` (see receiver_of); only run callbacks, or none, when `callbacks`
    says so. Due and expired are judged, and the lease set, on the database's clock: a node
    whose own clock runs ahead would take a lease another node still holds, and send the
    same delivery."""
    with session_scope(ctx.engine, write=True) as s:
        now = database_now(s)
        query = select(Delivery).where(
            Delivery.status == DeliveryStatus.PENDING,
            or_(col(Delivery.lease_expires_at).is_(None), col(Delivery.lease_expires_at) < now),
        )
        if callbacks is not None:
            query = query.where(
                (Delivery.purpose == DeliveryPurpose.CALLBACK)
                if callbacks
                else (Delivery.purpose != DeliveryPurpose.CALLBACK)
            )
        if besides:
            receiver = func.coalesce(col(Delivery.channel_id), col(Delivery.target), "")
            query = query.where(receiver.not_in(sorted(besides)))
        if only is not None:
            query = query.where(Delivery.id == only)
        else:
            query = query.where(col(Delivery.next_attempt_at) <= now)
        rows = s.exec(
            query.order_by(col(Delivery.next_attempt_at))
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        expires = now + timedelta(seconds=_lease_seconds(ctx))
        for row in rows:
            row.lease_owner = ctx.node_id
            row.lease_expires_at = expires
            s.add(row)
        return list(rows)


def release_own(ctx: Context) -> None:
    """At start-up: deliveries this node id held before a restart are free at once."""
    with session_scope(ctx.engine, write=True) as s:
        s.exec(
            update(Delivery)
            .where(
                col(Delivery.status) == DeliveryStatus.PENDING,
                col(Delivery.lease_owner) == ctx.node_id,
            )
            .values(lease_owner=None, lease_expires_at=None)
        )


def attempt(ctx: Context, delivery: Delivery) -> str | None:
    """Send a claimed delivery and record how it went; the failure's reason, or None."""
    error: str | None = None
    permanent = False
    try:
        _send(ctx, delivery)
    except AlertUndeliverable as exc:
        error, permanent = exc.message, exc.permanent
    except Exception as exc:  # one broken delivery must not stop the others
        log.exception("delivery %s failed unexpectedly", delivery.id)
        error = f"floom could not send it ({type(exc).__name__})"
    _record_result(ctx, delivery, error=error, permanent=permanent)
    return error


def _send(ctx: Context, delivery: Delivery) -> None:
    if delivery.purpose == DeliveryPurpose.CALLBACK:
        send_callback(
            ctx, delivery_id=delivery.id, url=delivery.target or "", body=delivery.body_json
        )
        return
    with session_scope(ctx.engine) as s:
        row = s.get(AlertChannel, delivery.channel_id) if delivery.channel_id else None
    if row is None:
        raise AlertUndeliverable(f"channel {delivery.channel_name} was deleted", permanent=True)
    send_alert(
        ctx, delivery_id=delivery.id, channel=Channel.of(row), body=incidents.body_of(delivery)
    )


def _record_result(ctx: Context, delivery: Delivery, *, error: str | None, permanent: bool) -> None:
    attempts = delivery.attempts + 1
    values: dict[str, Any] = {"attempts": attempts, "lease_owner": None, "lease_expires_at": None}
    if error is None:
        values.update(status=DeliveryStatus.DELIVERED, delivered_at=db_now(), last_error=None)
    elif permanent or attempts >= delivery.max_attempts:
        values.update(status=DeliveryStatus.FAILED, last_error=error[:500])
    else:
        delay = min(ctx.settings.alert_retry_seconds * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)
        values.update(last_error=error[:500], next_attempt_at=db_now(delay))
    with session_scope(ctx.engine, write=True) as s:
        written = s.exec(update(Delivery).where(*_still_ours(ctx, delivery)).values(**values))
        if written.rowcount == 0:
            log.info(
                "delivery %s: its lease passed to another sender; result not recorded", delivery.id
            )


def _still_ours(ctx: Context, delivery: Delivery) -> tuple[ColumnElement[bool], ...]:
    """Where `delivery` is still pending, claimed by this node, and not tried since it was
    read: what this node may write to it."""
    return (
        col(Delivery.id) == delivery.id,
        col(Delivery.status) == DeliveryStatus.PENDING,
        col(Delivery.lease_owner) == ctx.node_id,
        col(Delivery.attempts) == delivery.attempts,
    )


def deliver_due(ctx: Context) -> int:
    """Send what is due; how many were claimed."""
    claimed = claim_due(ctx)
    send_claimed(ctx, claimed)
    return len(claimed)


def send_claimed(ctx: Context, claimed: list[Delivery]) -> None:
    """Send claimed deliveries one after another, each only if this node's claim on it still
    holds, renewed for the send: a claim taken with the batch covers one send, and the sends
    before it may have taken longer (a slow receiver each), so it may have run out and
    another node taken the delivery and sent it."""
    for delivery in claimed:
        if _renewed(ctx, delivery):
            attempt(ctx, delivery)
        else:
            log.info("delivery %s: its lease passed to another sender; not sent", delivery.id)


def _renewed(ctx: Context, delivery: Delivery) -> bool:
    with session_scope(ctx.engine, write=True) as s:
        written = s.exec(
            update(Delivery)
            .where(*_still_ours(ctx, delivery), col(Delivery.lease_expires_at) > db_now())
            .values(lease_expires_at=db_now(_lease_seconds(ctx)))
        )
        return bool(written.rowcount)


def list_deliveries(
    ctx: Context,
    *,
    status: str | None = None,
    purpose: str | None = None,
    channel: str | None = None,
    run_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    caller: Principal,
) -> tuple[list[Delivery], str | None]:
    """Newest first; `cursor` is the last id of the previous page. Needs the read scope."""
    caller.require("read")
    paging.check_limit(limit)
    for name, value, allowed in (("status", status, STATUSES), ("purpose", purpose, PURPOSES)):
        if value is not None and value not in allowed:
            raise InvalidRequest(
                f"unknown {name} '{quoted(value)}'", hint=f"one of {', '.join(allowed)}"
            )
    query = select(Delivery)
    if status:
        query = query.where(Delivery.status == status)
    if purpose:
        query = query.where(Delivery.purpose == purpose)
    if channel:
        query = query.where(Delivery.channel_name == channel)
    if run_id:
        query = query.where(Delivery.run_id == run_id)
    if cursor := paging.id_cursor(cursor, prefix="dlv"):
        query = query.where(col(Delivery.id) < cursor)
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(query.order_by(col(Delivery.id).desc()).limit(limit + 1)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


def get_delivery(ctx: Context, *, delivery_id: str, caller: Principal) -> Delivery:
    caller.require("read")
    with session_scope(ctx.engine) as s:
        row = s.get(Delivery, delivery_id)
    if row is None:
        raise NotFound(
            f"no delivery {quoted(delivery_id)}", hint=told(act("alerts deliveries"), " lists them")
        )
    return row


def resend(ctx: Context, *, delivery_id: str, caller: Principal) -> Delivery:
    """Send a delivery again, now: a failed or throttled one is tried afresh; a delivered
    one is copied into a new delivery (its receiver asked for it again). Needs the deploy
    scope. A pending one is already on its way (Conflict)."""
    caller.require("deploy")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        delivery = s.get(Delivery, delivery_id, with_for_update=True)
        if delivery is None:
            raise NotFound(
                f"no delivery {quoted(delivery_id)}",
                hint=told(act("alerts deliveries"), " lists them"),
            )
        if delivery.status == DeliveryStatus.PENDING:
            raise Conflict(
                f"delivery {delivery_id} is pending: it is sent (or tried again) already",
                hint=told("wait for it; ", act("alerts deliveries"), " shows when it is due"),
            )
        now = database_now(s)
        if delivery.status == DeliveryStatus.DELIVERED:
            delivery = Delivery(
                **{
                    **delivery.model_dump(),
                    "id": new_id("dlv"),
                    "delivered_at": None,
                    "created_at": now,
                }
            )
        delivery.status = DeliveryStatus.PENDING
        delivery.attempts = 0
        delivery.next_attempt_at = now
        delivery.last_error = None
        delivery.lease_owner = None
        delivery.lease_expires_at = None
        s.add(delivery)
    return delivery


def send_test(ctx: Context, *, channel_name: str, caller: Principal) -> Delivery:
    """Send a test alert to a channel now and wait for the result: the delivery, recorded
    and listed like any other (tried once). Raises AlertUndeliverable saying why it failed.
    Needs the deploy scope."""
    caller.require("deploy")
    channel = get_channel(ctx, name=channel_name, caller=caller)
    now = utcnow()
    body: dict[str, Any] = {
        "type": "test",
        "event_id": None,
        "timestamp": now.isoformat(),
        "summary": f"test alert to channel {channel.name}, sent by {caller.describe()}",
        "about": "a test: the channel works",
        "subject": f"channel:{channel.name}",
        "worker": None,
        "run_id": None,
        "run_url": None,
        "error": None,
        "details": {},
    }
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        # Sent here and now, not by the alert loop (which would take it first); due later
        # only in case this process dies before it sends it.
        delivery = incidents.enqueue(
            ctx,
            s,
            purpose=DeliveryPurpose.TEST,
            body=body,
            channel=channel,
            max_attempts=1,
            due_in=60,
        )
    claimed = claim_due(ctx, only=delivery.id)
    if not claimed:
        return delivery
    error = attempt(ctx, claimed[0])
    if error is not None:
        raise AlertUndeliverable(
            f"the test alert to channel {channel.name} was not delivered: {error}",
            hint=told(
                "check the channel's settings and secrets (",
                act("alerts channels"),
                "), then send the test again",
            ),
            details={"delivery_id": delivery.id, "channel": channel.name},
        )
    return get_delivery(ctx, delivery_id=delivery.id, caller=caller)
