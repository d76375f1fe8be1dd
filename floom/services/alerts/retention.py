"""Retention for alerts: events, closed incidents and finished deliveries (with their run
callbacks) older than FLOOM_ALERT_RETENTION_DAYS go, in batches, as part of each retention
pass (floom/services/ops/retention.py).

What still matters is kept however old: an open incident and its events (a later event
groups into it), an event about a run that has not ended (an approval still waiting would
alert again if its event went), and a pending delivery (still to be sent).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, exists
from sqlmodel import col, select

from floom.services.runs import rules as run_rules
from floom.store.db import session_scope
from floom.store.models import AlertEvent, AlertIncident, Delivery, Run, RunCallback

if TYPE_CHECKING:
    from floom.services.context import Context

BATCH = 500
_ENDED_DELIVERY = ("delivered", "failed", "throttled")
_FINISHED = sorted(run_rules.FINISHED)


@dataclass
class AlertsPruned:
    events: int = 0
    incidents: int = 0
    deliveries: int = 0


def prune_alerts(
    ctx: Context, *, days: int, now: datetime, batch: int = BATCH, max_batches: int | None = None
) -> AlertsPruned:
    """Delete what is older than `days` (0: nothing), a batch of each kind per transaction.
    Idempotent; `max_batches` bounds the batches of each kind."""
    pruned = AlertsPruned()
    if days <= 0:
        return pruned
    cutoff = now - timedelta(days=days)
    for step in (_deliveries_batch, _events_batch, _incidents_batch):
        done = 0
        while max_batches is None or done < max_batches:
            if not step(ctx, cutoff=cutoff, limit=batch, into=pruned):
                break
            done += 1
    return pruned


def _deliveries_batch(ctx: Context, *, cutoff: datetime, limit: int, into: AlertsPruned) -> bool:
    with session_scope(ctx.engine, write=True) as s:
        ids = list(
            s.exec(
                select(Delivery.id)
                .where(col(Delivery.status).in_(_ENDED_DELIVERY), col(Delivery.created_at) < cutoff)
                .limit(limit)
            ).all()
        )
        if not ids:
            return False
        # A callback whose delivery went is done with: its run has ended and been told.
        s.execute(delete(RunCallback).where(col(RunCallback.delivery_id).in_(ids)))
        s.execute(delete(Delivery).where(col(Delivery.id).in_(ids)))
        into.deliveries += len(ids)
    return True


def _events_batch(ctx: Context, *, cutoff: datetime, limit: int, into: AlertsPruned) -> bool:
    in_open_incident = exists().where(
        col(AlertIncident.id) == col(AlertEvent.incident_id),
        col(AlertIncident.open_key).is_not(None),
    )
    run_going_on = exists().where(
        col(Run.id) == col(AlertEvent.run_id), col(Run.status).not_in(_FINISHED)
    )
    with session_scope(ctx.engine, write=True) as s:
        ids = list(
            s.exec(
                select(AlertEvent.id)
                .where(col(AlertEvent.created_at) < cutoff, ~in_open_incident, ~run_going_on)
                .limit(limit)
            ).all()
        )
        if not ids:
            return False
        s.execute(delete(AlertEvent).where(col(AlertEvent.id).in_(ids)))
        into.events += len(ids)
    return True


def _incidents_batch(ctx: Context, *, cutoff: datetime, limit: int, into: AlertsPruned) -> bool:
    with session_scope(ctx.engine, write=True) as s:
        ids = list(
            s.exec(
                select(AlertIncident.id)
                .where(
                    col(AlertIncident.open_key).is_(None),
                    col(AlertIncident.closed_at) < cutoff,
                    # kept while an event still refers to it (one about a run going on)
                    ~exists().where(col(AlertEvent.incident_id) == col(AlertIncident.id)),
                )
                .limit(limit)
            ).all()
        )
        if not ids:
            return False
        s.execute(delete(AlertIncident).where(col(AlertIncident.id).in_(ids)))
        into.incidents += len(ids)
    return True
