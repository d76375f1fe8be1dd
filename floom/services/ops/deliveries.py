"""Retention of webhook and Composio deliveries and of the tombstones of deleted workers'
deliveries: what goes, and the delivery keys that must stay so a captured request sent
again is still refused.

A key guards against a delivery sent again only while its signature can verify. Standard
Webhooks (Composio's too) and floom's hmac-sha256 sign a timestamp that is accepted
TOLERANCE_SECONDS either side of the server's time: past twice that (and a day for clocks)
a captured request guards nothing. The key also dedupes a sender's own retries of a message
whose answer it did not get, each signed afresh under the same id, for as long as its retry
schedule runs (Svix about 28 hours, Stripe 3 days): so a timestamped key is kept KEY_GRACE,
7 days, after its delivery came. GitHub signs no timestamp: its deliveries verify for as
long as their secret stands, so their keys are kept for good (as tombstones once a delivery
goes), and so is every key whose scheme is not known any more. The scheme is the one that
verified the delivery (WebhookDelivery.signature), not its trigger's now: a redeploy changes
a webhook's scheme in place, and a captured GitHub delivery must not run again after a
rollback to GitHub's scheme.

A deleted worker's timestamped keys are buried with an expiry (`expires_at`, KEY_GRACE after
the deletion, so at least KEY_GRACE after they came); retention prunes them after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, exists, false, literal, or_
from sqlmodel import Session, col, select

from floom.services.runs import rules as run_rules
from floom.services.triggers.registry import spec_of
from floom.store.models import Run, UTCDateTime
from floom.store.triggers import DeliveryTombstone, Trigger, WebhookDelivery
from floom.triggers.signatures import TOLERANCE_SECONDS
from floom.triggers.spec import WebhookSpec
from floom.vocabulary import RunTrigger

KEY_GRACE = max(timedelta(seconds=2 * TOLERANCE_SECONDS) + timedelta(days=1), timedelta(days=7))
"""How long a timestamped delivery's key is kept after it was received: past its signature's
window and past senders' retry schedules."""
TIMESTAMPED = frozenset({"standard", "hmac-sha256"})
BATCH = 200
TOMBSTONE_BATCH = 1000  # tombstones deleted per transaction


def prune_deliveries(
    s_factory: Any,
    *,
    which: Any,
    cutoff: datetime,
    now: datetime,
    limit: int = BATCH,
) -> int | None:
    """Delete up to `limit` deliveries received before `cutoff` (and before KEY_GRACE ago),
    matching `which`, whose run has finished (or that started none); a delivery whose key
    still guards (GitHub's, or a scheme no longer known) leaves a tombstone. Returns how many
    went, None when none was left. `s_factory()` opens a write transaction."""
    cutoff = min(cutoff, now - KEY_GRACE)
    unfinished = exists().where(
        col(Run.id) == col(WebhookDelivery.run_id),
        col(Run.status).not_in(sorted(run_rules.FINISHED)),
    )
    with s_factory() as s:
        found = list(
            s.exec(
                select(WebhookDelivery)
                .where(which, col(WebhookDelivery.received_at) < cutoff, ~unfinished)
                .order_by(col(WebhookDelivery.received_at))
                .limit(limit)
            ).all()
        )
        if not found:
            return None
        timestamped = timestamped_triggers(s, {d.trigger_id for d in found if d.trigger_id})
        for delivery in found:
            if not _signed_with_timestamp(delivery, timestamped):
                _bury(s, delivery)
        s.execute(delete(WebhookDelivery).where(col(WebhookDelivery.id).in_([d.id for d in found])))
    return len(found)


def prune_tombstones(s_factory: Any, *, now: datetime, limit: int = TOMBSTONE_BATCH) -> int:
    """Delete the tombstones whose key no longer guards: those past their `expires_at` (a
    deleted worker's timestamped keys), and Composio's (always timestamped) past KEY_GRACE.
    A tombstone without an expiry (GitHub's, or one stored before expiries were) is kept.
    Up to `limit` per transaction, walking the ids: a deleted worker can leave many, and on
    SQLite one DELETE of them all held the write lock (heartbeats waited) until it ended."""
    guards_nothing = or_(
        col(DeliveryTombstone.expires_at) < now,
        and_(
            col(DeliveryTombstone.source) == RunTrigger.COMPOSIO,
            col(DeliveryTombstone.received_at) < now - KEY_GRACE,
        ),
    )
    deleted = 0
    after = 0
    while True:
        with s_factory() as s:
            ids = list(
                s.exec(
                    select(DeliveryTombstone.id)
                    .where(col(DeliveryTombstone.id) > after, guards_nothing)
                    .order_by(col(DeliveryTombstone.id))
                    .limit(limit)
                ).all()
            )
            if not ids:
                return deleted
            s.execute(delete(DeliveryTombstone).where(col(DeliveryTombstone.id).in_(ids)))
        deleted += len(ids)
        after = max(i for i in ids if i is not None)


def timestamped_triggers(s: Session, ids: Iterable[str]) -> dict[str, datetime]:
    """Of the triggers `ids`, the webhooks whose signature scheme signs a timestamp now, each
    with the time its settings were last written (`updated_at`): a delivery received since
    was verified with that scheme (a redeploy changes a webhook's scheme in place)."""
    found = {}
    for trigger in s.exec(select(Trigger).where(col(Trigger.id).in_(list(ids)))).all():
        spec = spec_of(trigger)
        if isinstance(spec, WebhookSpec) and spec.signature in TIMESTAMPED:
            found[trigger.id] = trigger.updated_at
    return found


def _signed_with_timestamp(delivery: WebhookDelivery, timestamped: dict[str, datetime]) -> bool:
    """Whether `delivery`'s signature signed a timestamp, so its key guards only KEY_GRACE:
    Composio's always; a webhook's by the scheme that verified it, or for one stored before
    that was kept, by its trigger's scheme if unchanged since it came (`timestamped`, see
    timestamped_triggers). A key whose scheme is not known is kept for good."""
    if delivery.source == RunTrigger.COMPOSIO:
        return True
    if delivery.signature is not None:
        return delivery.signature in TIMESTAMPED
    since = timestamped.get(delivery.trigger_id or "")
    return since is not None and since <= delivery.received_at


def signed_with_timestamp(d: Any, timestamped: dict[str, datetime]) -> ColumnElement[bool]:
    """_signed_with_timestamp as a condition on the deliveries table `d`."""
    unrecorded = [
        and_(d.c.trigger_id == trigger_id, d.c.received_at >= literal(since, UTCDateTime()))
        for trigger_id, since in sorted(timestamped.items())
    ]
    return or_(
        d.c.source == RunTrigger.COMPOSIO,
        d.c.signature.in_(sorted(TIMESTAMPED)),
        and_(d.c.signature.is_(None), or_(false(), *unrecorded)),
    )


def _bury(s: Session, delivery: WebhookDelivery) -> None:
    for key in sorted({k for k in (delivery.delivery_key, delivery.signature_digest) if k}):
        held = s.exec(
            select(DeliveryTombstone.id).where(
                DeliveryTombstone.source == delivery.source,
                DeliveryTombstone.worker_name == delivery.worker_name,
                DeliveryTombstone.key == key,
            )
        ).first()
        if held is None:
            s.add(
                DeliveryTombstone(
                    source=delivery.source,
                    worker_name=delivery.worker_name,
                    key=key,
                    delivery_id=delivery.id,
                    run_id=delivery.run_id,
                    outcome=delivery.outcome,
                    received_at=delivery.received_at,
                )
            )
    s.flush()
