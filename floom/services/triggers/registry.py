"""Triggers of workers: synced from the active version on deploy and rollback, listed with
their next fire times, paused and resumed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.manifest.schema import Manifest
from floom.manifest.triggers import parse_triggers
from floom.services import wakeups
from floom.services.access.principal import Principal
from floom.store.db import database_clock, session_scope
from floom.store.models import Worker, new_id, utcnow
from floom.store.triggers import Trigger
from floom.triggers import cron
from floom.triggers.spec import (
    ScheduleSpec,
    TriggerSpec,
    spec_from_config,
    spec_to_config,
    trigger_key,
)
from floom.vocabulary import TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

NEXT_FIRES_SHOWN = 3


def sync_triggers(s: Session, *, worker_name: str, manifest: Manifest) -> None:
    """Make the stored triggers match the manifest being activated, in the caller's
    transaction.

    A trigger whose identity is unchanged keeps its row: its id, pause and last fire, so a
    due fire is neither lost nor made twice. A trigger no longer declared is marked removed
    and stops. A new (or returning) schedule starts from now: nothing is back-filled.
    """
    specs = parse_triggers(manifest)
    # The database's time, as the scheduler's (a schedule deployed from a node whose own
    # clock is off starts now all the same: no tick before it, none skipped after).
    now = database_clock(s.get_bind()).now()
    rows = {
        t.key: t for t in s.exec(select(Trigger).where(Trigger.worker_name == worker_name)).all()
    }
    wanted: set[str] = set()
    for position, spec in enumerate(specs):
        key = trigger_key(spec)
        wanted.add(key)
        row = rows.get(key)
        if row is None:
            row = Trigger(
                id=new_id("trg"), worker_name=worker_name, kind=spec.kind, key=key, last_fire_at=now
            )
        elif row.removed_at is not None:
            row.removed_at = None
            row.last_fire_at = now
        row.position = position
        row.config_json = json.dumps(spec_to_config(spec), sort_keys=True)
        row.updated_at = now
        s.add(row)
    for key, row in rows.items():
        if key not in wanted and row.removed_at is None:
            row.removed_at = now
            row.updated_at = now
            s.add(row)
    # The scheduler and the handoff bridge sleep until their triggers change.
    kinds = {spec.kind for spec in specs}
    if TriggerKind.SCHEDULE in kinds:
        wakeups.SCHEDULES.notify_on_commit(s)
    if TriggerKind.HANDOFF in kinds or any(
        row.kind == TriggerKind.HANDOFF for row in rows.values()
    ):
        wakeups.HANDOFFS.notify_on_commit(s)


def spec_of(trigger: Trigger) -> TriggerSpec | None:
    """The trigger as its worker.yml declared it; None for a stored row that cannot be read
    back (not JSON, over a bound, not the fields of its kind: written by hand or by another
    program). Every reader skips such a trigger: it never fires, never matches an event, and
    is listed with its stored config marked, so one row cannot stop the others or a page."""
    config = jsonvalues.stored(trigger.config_json, expect=dict)
    if jsonvalues.UNREADABLE in config:
        return None
    try:
        return spec_from_config(trigger.kind, config)
    except (TypeError, ValueError):
        return None


def list_triggers(
    ctx: Context, *, worker_name: str, caller: Principal
) -> tuple[Worker, list[Trigger]]:
    """The worker and its current triggers, in worker.yml order. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        worker = _worker(s, worker_name)
        rows = s.exec(
            select(Trigger)
            .where(Trigger.worker_name == worker_name, col(Trigger.removed_at).is_(None))
            .order_by(col(Trigger.position))
        ).all()
        return worker, list(rows)


def get_trigger(
    ctx: Context, *, trigger_id: str, worker_name: str | None = None, caller: Principal
) -> Trigger:
    """One trigger (of `worker_name`, when given). Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return _trigger(s, trigger_id, worker_name)


def set_paused(
    ctx: Context,
    *,
    worker_name: str,
    paused: bool,
    trigger_id: str | None = None,
    caller: Principal,
) -> tuple[Worker, Trigger | None]:
    """Pause or resume a whole worker, or one of its triggers.

    Paused, a schedule keeps ticking but each tick is recorded as skipped (paused), and a
    webhook or Composio event is stored and answered without a run. Resuming does not
    back-fill the ticks skipped meanwhile. Needs the deploy scope (checked again in the
    writing transaction).
    """
    caller.require("deploy")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        worker = _worker(s, worker_name)
        trigger = None
        if trigger_id:
            trigger = _trigger(s, trigger_id, worker_name)
            if trigger.removed_at is not None:
                raise InvalidRequest(
                    f"trigger {trigger_id} was removed from '{worker_name}'",
                    hint=told(act("triggers", worker=worker_name), " lists the current triggers"),
                )
            trigger.paused = paused
            trigger.updated_at = utcnow()
            s.add(trigger)
        else:
            worker.paused = paused
            worker.updated_at = utcnow()
            s.add(worker)
        # A paused bridge takes no job; a resumed one starts taking them again.
        wakeups.HANDOFFS.notify_on_commit(s)
    return worker, trigger


def _worker(s: Session, name: str) -> Worker:
    worker = s.get(Worker, name)
    if worker is None:
        raise NotFound(
            f"no worker named '{quoted(name)}'", hint=told(act("workers"), " lists them")
        )
    return worker


def _trigger(s: Session, trigger_id: str, worker_name: str | None) -> Trigger:
    trigger = s.get(Trigger, trigger_id)
    if trigger is None or (worker_name and trigger.worker_name != worker_name):
        where = f" of worker '{worker_name}'" if worker_name else ""
        raise NotFound(
            f"no trigger {quoted(trigger_id)}{where}",
            hint=told(act("triggers", worker=worker_name or "WORKER"), " lists the triggers"),
        )
    return trigger


# -- presentation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HookUrls:
    """Where webhooks reach this server: FLOOM_PUBLIC_URL, else the request's base URL."""

    base: str

    def worker(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/hooks/{name}"


def next_fire_times(
    spec: ScheduleSpec, *, after: datetime | None = None, count: int = NEXT_FIRES_SHOWN
) -> list[datetime]:
    """The next fire times, as aware datetimes in the schedule's own timezone."""
    tz = cron.zone(spec.timezone)
    times = cron.next_fire_times(spec.cron, tz, after=after or utcnow(), count=count)
    return [t.astimezone(tz) for t in times]


def summary(ctx: Context, *, worker_name: str, caller: Principal) -> list[dict[str, Any]]:
    """A short view of a worker's triggers for worker listings: kind, pause, next fire. Needs
    the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        worker = s.get(Worker, worker_name)
        rows = s.exec(
            select(Trigger)
            .where(Trigger.worker_name == worker_name, col(Trigger.removed_at).is_(None))
            .order_by(col(Trigger.position))
        ).all()
    worker_paused = worker is not None and worker.paused
    items = []
    for trigger in rows:
        active = not (trigger.paused or worker_paused)
        item: dict[str, Any] = {
            "id": trigger.id,
            "kind": trigger.kind,
            "paused": trigger.paused,
            "active": active,
        }
        spec = spec_of(trigger)
        if isinstance(spec, ScheduleSpec):
            upcoming = next_fire_times(spec, count=1) if active else []
            item["cron"] = spec.cron
            item["timezone"] = spec.timezone
            item["next_fire"] = upcoming[0].isoformat() if upcoming else None
        items.append(item)
    return items
