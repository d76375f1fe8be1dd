"""Schedule fires: each due tick of each schedule becomes exactly one run, or one skipped
run that says why (overlap, missed while down, paused).

Exactly once, even with several schedulers on one PostgreSQL: a tick is owned by whoever
inserts its (trigger, scheduled time) row in `trigger_fires`, in the same transaction as the
run; the other scheduler's insert fails on the unique key and it moves on.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom.errors import (
    Conflict,
    FloomError,
    NotFound,
    RunErrorCode,
    StoreUnavailable,
    WorkerPaused,
)
from floom.services.access import principal
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.services.triggers.registry import spec_of
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, RunEvent, Worker, new_id
from floom.store.statements.lock_waits import bounded_lock_waits, lock_wait_ran_out
from floom.store.triggers import Trigger, TriggerFire
from floom.triggers import cron
from floom.triggers.spec import ScheduleSpec
from floom.vocabulary import RunTrigger, TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.scheduler")

# A tick handled this late still counts as on time (not "missed while down").
ON_TIME_SECONDS = 60.0
# A schedule's last fire further ahead of the clock than this was written by a clock that
# ran ahead and was set back (schedulers go by the database's clock, floom/store/db.py
# DatabaseClock: on SQLite the host's, on PostgreSQL the server's): its ticks are judged
# again (_judge_again_when_due).
CLOCK_STEP_SECONDS = 300.0
# A week of a once-a-minute cron: the longest catch-up window holds no more fires.
MAX_FIRES_PER_PASS = 7 * 24 * 60 + 1
# How long a pass waits for a schedule's row (or its worker's) that another node holds
# (floom/store/statements/lock_waits.py): another scheduler fires a tick in milliseconds; a
# node frozen inside its transaction holds it for as long as it is frozen. Then the pass
# goes on to the other schedules and tries this one again this much later.
LOCK_WAIT_SECONDS = 2.0
LOCKED_RETRY_SECONDS = 1.0
# Why a tick did not become a run: its fire's outcome and its skipped run's error code.
OVERLAP_SKIP = RunErrorCode.OVERLAP_SKIP
MISSED = RunErrorCode.MISSED
PAUSED = RunErrorCode.PAUSED
START_FAILED = RunErrorCode.START_FAILED


@dataclass(frozen=True)
class Decision:
    scheduled_for: datetime
    fire: bool  # False: record as missed


class NextFireCache:
    """Next fire time per (trigger, config, last fire), so an idle tick computes nothing."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._items: dict[tuple[str, str, datetime], datetime | None] = {}

    def next_after(self, trigger: Trigger, spec: ScheduleSpec, base: datetime) -> datetime | None:
        key = (trigger.id, trigger.config_json, base)
        if key not in self._items:
            if len(self._items) >= self._size:
                self._items.clear()
            try:
                tz = cron.zone(spec.timezone)
                times = cron.next_fire_times(spec.cron, tz, after=base, count=1)
            except cron.CronError as exc:
                # Stored by an older floom that accepted more (e.g. `W`): it cannot fire, and
                # must not hold up the other schedules. Logged once per trigger version.
                log.warning("schedule %s cannot fire: %s", trigger.id, exc.message)
                times = []
            self._items[key] = times[0] if times else None
        return self._items[key]


def fire_due(ctx: Context, *, now: datetime, cache: NextFireCache | None = None) -> datetime | None:
    """Handle every schedule tick due at `now`; return the earliest fire time still ahead."""
    cache = cache or NextFireCache()
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Trigger, Worker)
            .join(Worker, col(Worker.name) == col(Trigger.worker_name))
            .where(
                Trigger.kind == TriggerKind.SCHEDULE,
                col(Trigger.removed_at).is_(None),
                col(Worker.active_version_id).is_not(None),
            )
        ).all()
    upcoming: datetime | None = None
    for trigger, worker in rows:
        spec = spec_of(trigger)
        if not isinstance(spec, ScheduleSpec):
            continue  # a stored row that cannot be read (spec_of) never fires
        try:
            # Only where rows are locked: an idle pass (its one read) sends nothing more.
            with bounded_lock_waits(LOCK_WAIT_SECONDS):
                due = _handle(ctx, trigger=trigger, worker=worker, spec=spec, now=now, cache=cache)
        except StoreUnavailable as exc:
            if not lock_wait_ran_out(exc):
                raise  # for every trigger alike: the loop tries the whole pass again
            # Another node holds this schedule's row, or its worker's, past LOCK_WAIT_SECONDS:
            # frozen inside a transaction, most likely. The others go on; this one is tried
            # again soon, and fires once that node lets go (dies, or thaws and finishes).
            log.warning(
                "schedule %s of %s: another node has held its row (or its worker's) for over "
                "%g s; its due ticks wait, the other schedules go on",
                trigger.id,
                worker.name,
                LOCK_WAIT_SECONDS,
            )
            due = now + timedelta(seconds=LOCKED_RETRY_SECONDS)
        except Exception:  # one broken trigger must not hold up the others
            log.exception("schedule %s of %s failed; retrying", trigger.id, worker.name)
            continue
        if due is not None and (upcoming is None or due < upcoming):
            upcoming = due
    return upcoming


def _handle(
    ctx: Context,
    *,
    trigger: Trigger,
    worker: Worker,
    spec: ScheduleSpec,
    now: datetime,
    cache: NextFireCache,
) -> datetime | None:
    """Fire the schedule's ticks due at `now`; its next fire time."""
    base = trigger.last_fire_at or trigger.created_at
    if trigger.last_fire_at is not None and base > now + timedelta(seconds=CLOCK_STEP_SECONDS):
        base = _judge_again_when_due(ctx, trigger=trigger, now=now)
    due = cache.next_after(trigger, spec, base)
    if due is not None and due <= now:
        base = _handle_due(ctx, trigger=trigger, worker=worker, spec=spec, now=now)
        due = cache.next_after(trigger, spec, base)
    return due


def _judge_again_when_due(ctx: Context, *, trigger: Trigger, now: datetime) -> datetime:
    """The schedule's last fire is ahead of this clock: a clock that ran ahead (this node's,
    since stepped back, or another node's) judged ticks that had not come. The skipped runs
    it recorded for them (missed, paused, overlap) are taken back and the schedule resumes
    from `now`, so each is judged again when it comes; a tick that became a run keeps it
    and is not run again (its fire row stays). Returns the new base."""
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Trigger, trigger.id, with_for_update=True)
        if row is None:
            return now
        margin = timedelta(seconds=CLOCK_STEP_SECONDS)
        if row.last_fire_at is None or row.last_fire_at <= now + margin:  # done meanwhile
            return row.last_fire_at or row.created_at
        ahead = (row.last_fire_at - now).total_seconds()
        skipped = list(
            s.exec(
                select(TriggerFire.run_id).where(
                    TriggerFire.trigger_id == trigger.id,
                    col(TriggerFire.scheduled_for) > now,
                    col(TriggerFire.outcome) != "run",
                )
            ).all()
        )
        run_ids = [r for r in skipped if r is not None]
        s.exec(
            delete(TriggerFire).where(
                col(TriggerFire.trigger_id) == trigger.id,
                col(TriggerFire.scheduled_for) > now,
                col(TriggerFire.outcome) != "run",
            )
        )
        if run_ids:
            s.exec(delete(RunEvent).where(col(RunEvent.run_id).in_(run_ids)))
            s.exec(
                delete(Run).where(col(Run.id).in_(run_ids), col(Run.status) == run_rules.SKIPPED)
            )
        row.last_fire_at = now
        s.add(row)
    log.warning(
        "schedule %s of %s: its last fire was %.0f s ahead of this node's clock (a clock ran "
        "ahead and was set back); %d tick(s) judged before they came will be judged again",
        trigger.id,
        trigger.worker_name,
        ahead,
        len(skipped),
    )
    return now


def plan(
    spec: ScheduleSpec, *, base: datetime, now: datetime
) -> tuple[datetime | None, list[Decision]]:
    """What to do with the ticks after `base` up to `now`, by the catch-up policy.

    Returns the first tick older than the catch-up window (all those are missed; one record
    stands for them) and a decision per tick inside the window.
    """
    tz = cron.zone(spec.timezone)
    window_start = now - timedelta(seconds=spec.catch_up_window)
    too_old = None
    if base < window_start:
        first = cron.next_fire_times(spec.cron, tz, after=base, count=1)
        if first and first[0] <= window_start:
            too_old = first[0]
        base = window_start
    times, _ = cron.fire_times_between(
        spec.cron, tz, after=base, until=now, limit=MAX_FIRES_PER_PASS
    )
    late = [t for t in times if (now - t).total_seconds() > ON_TIME_SECONDS]
    on_time = times[len(late) :]
    if spec.catch_up == "all":
        fire = set(times)
    elif spec.catch_up == "none" or on_time:
        fire = set(on_time)
    else:  # latest: only the most recent of the ticks missed while down
        fire = {late[-1]} if late else set()
    return too_old, [Decision(t, t in fire) for t in times]


def _handle_due(
    ctx: Context, *, trigger: Trigger, worker: Worker, spec: ScheduleSpec, now: datetime
) -> datetime:
    """Handle the due ticks in order; returns the last one handled."""
    base = trigger.last_fire_at or trigger.created_at
    too_old, decisions = plan(spec, base=base, now=now)
    last = base
    window = _duration(spec.catch_up_window)
    if too_old is not None:
        message = (
            f"every tick from {_local(too_old, spec)} until {window} before "
            f"{_local(now, spec)} was missed: the scheduler was not running, and catch_up_window "
            f"is {window}"
        )
        _record_skip(ctx, trigger, worker, spec, too_old, MISSED, message)
        last = too_old
    # Ticks that become no run are recorded a batch at a time: after a day's downtime an
    # every-minute schedule has 1,439 of them, and a transaction each held the scheduler
    # (every other schedule of the node) for seconds.
    skipped: list[_Skip] = []
    for decision in decisions:
        t = decision.scheduled_for
        if not decision.fire:
            reason = (
                "catch_up is none"
                if spec.catch_up == "none"
                else "catch_up is latest and a later tick ran instead"
            )
            message = f"missed while the scheduler was not running ({reason})"
            skipped.append(_Skip(t, MISSED, message))
        elif trigger.paused or worker.paused:
            what = "this trigger" if trigger.paused else f"worker '{worker.name}'"
            skipped.append(_Skip(t, PAUSED, f"{what} is paused"))
        else:
            _record_skips(ctx, trigger, worker, spec, skipped)
            skipped = []
            _fire(ctx, trigger, worker, spec, t)
        last = t
    _record_skips(ctx, trigger, worker, spec, skipped)
    return last


def _fire(ctx: Context, trigger: Trigger, worker: Worker, spec: ScheduleSpec, t: datetime) -> None:
    needs_active = spec.overlap in ("skip", "cancel_running")
    active = _active_runs(ctx, trigger.id) if needs_active else []
    if active and spec.overlap == "skip":
        previous = active[0]
        message = (
            f"overlap is skip and run {previous.id} of this schedule is still {previous.status}"
        )
        _record_skip(ctx, trigger, worker, spec, t, OVERLAP_SKIP, message)
        return

    def record(s: Session, run: Run) -> None:
        # Read again under its lock: a pause or a redeploy that removed it may have committed
        # since this pass read it (the worker's pause is seen by create_run the same way).
        locked = s.get(Trigger, trigger.id, with_for_update=True, populate_existing=True)
        if locked is None or locked.removed_at is not None:
            raise _TriggerGone
        if locked.paused:
            raise _TriggerPaused
        run.trigger_id = trigger.id
        if spec.overlap == "queue":
            run.concurrency = 1  # waits until the worker's running runs have ended
        s.add(
            TriggerFire(
                trigger_id=trigger.id,
                scheduled_for=t,
                outcome="run",
                run_id=run.id,
                node_id=ctx.node_id,
            )
        )
        s.flush()  # the exactly-once key: fails here if another scheduler owns the tick
        _advance(s, trigger.id, t)

    try:
        run = runs.create_run(
            ctx,
            worker_name=worker.name,
            inputs=spec.inputs,
            trigger=RunTrigger.SCHEDULE,
            caller=principal.SYSTEM,
            scheduled_for=t,
            in_transaction=record,
        )
    except IntegrityError:
        _advance_alone(ctx, trigger.id, t)
        return
    except _TriggerGone:
        return  # removed since this pass read it: its ticks end with it
    except _TriggerPaused:
        _record_skip(ctx, trigger, worker, spec, t, PAUSED, "this trigger is paused")
        return
    except StoreUnavailable:
        # Not this tick's fault, nor lasting: it is tried again at the next pass (then by
        # the catch-up policy if that is over a minute late), not written off as start_failed.
        raise
    except WorkerPaused as exc:  # paused since this tick read the worker
        _record_skip(ctx, trigger, worker, spec, t, PAUSED, exc.message)
        return
    except FloomError as exc:  # e.g. the worker's inputs changed under the schedule
        message = f"could not start: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
        _record_skip(ctx, trigger, worker, spec, t, START_FAILED, message)
        return
    if spec.overlap == "cancel_running":
        for previous in active:
            with contextlib.suppress(Conflict):  # it ended meanwhile
                runs.cancel_run(
                    ctx, run_id=previous.id, caller=principal.system(f"schedule, for {run.id}")
                )


class _TriggerGone(Exception):
    """The schedule was removed since the pass read it; nothing is queued for its tick."""


class _TriggerPaused(Exception):
    """The schedule was paused since the pass read it; its tick is recorded as paused."""


def _active_runs(ctx: Context, trigger_id: str) -> list[Run]:
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(Run)
                .where(Run.trigger_id == trigger_id, col(Run.status).not_in(run_rules.FINISHED))
                .order_by(col(Run.id))
            ).all()
        )


@dataclass(frozen=True)
class _Skip:
    """A tick that becomes no run, and why."""

    scheduled_for: datetime
    code: RunErrorCode
    message: str

    def said(self) -> tuple[datetime, RunErrorCode, str]:
        return self.scheduled_for, self.code, self.message


SKIPS_PER_TRANSACTION = 500


def _record_skips(
    ctx: Context, trigger: Trigger, worker: Worker, spec: ScheduleSpec, skips: list[_Skip]
) -> None:
    """Ticks that become no run, in order, up to SKIPS_PER_TRANSACTION in one transaction.
    A batch another scheduler recorded any tick of (the exactly-once key) is recorded again
    tick by tick, which skips what that scheduler owns."""
    for start in range(0, len(skips), SKIPS_PER_TRANSACTION):
        batch = skips[start : start + SKIPS_PER_TRANSACTION]
        if len(batch) == 1:
            _record_skip(ctx, trigger, worker, spec, *batch[0].said())
            continue
        try:
            with session_scope(ctx.engine, write=True) as s:
                workers.lock_worker(s, worker.name)
                for skip in batch:
                    _insert_skip(s, ctx, trigger, worker, spec, skip)
                _advance(s, trigger.id, batch[-1].scheduled_for)
        except IntegrityError:
            for skip in batch:
                _record_skip(ctx, trigger, worker, spec, *skip.said())
            continue
        except NotFound:
            return  # the worker was deleted since this tick read it: nothing is left to record
        first, last = batch[0], batch[-1]
        log.info(
            "schedule %s of %s: %d ticks from %s to %s became no run (%s)",
            trigger.id,
            worker.name,
            len(batch),
            first.scheduled_for.isoformat(),
            last.scheduled_for.isoformat(),
            last.message,
        )


def _insert_skip(
    s: Session, ctx: Context, trigger: Trigger, worker: Worker, spec: ScheduleSpec, skip: _Skip
) -> None:
    run_id = new_id("run")
    s.add(
        TriggerFire(
            trigger_id=trigger.id,
            scheduled_for=skip.scheduled_for,
            outcome=skip.code,
            run_id=run_id,
            node_id=ctx.node_id,
        )
    )
    s.flush()  # the exactly-once key, as for a run
    runs.insert_skipped_run(
        s,
        run_id=run_id,
        worker_name=worker.name,
        version_id=worker.active_version_id,
        trigger=RunTrigger.SCHEDULE,
        trigger_id=trigger.id,
        code=skip.code,
        reason=skip.message,
        inputs=spec.inputs,
        scheduled_for=skip.scheduled_for,
    )


def _record_skip(
    ctx: Context,
    trigger: Trigger,
    worker: Worker,
    spec: ScheduleSpec,
    t: datetime,
    code: RunErrorCode,
    message: str,
) -> None:
    """A tick that does not become a run: a skipped run row, visible in every run list."""
    try:
        with session_scope(ctx.engine, write=True) as s:
            workers.lock_worker(s, worker.name)
            _insert_skip(s, ctx, trigger, worker, spec, _Skip(t, code, message))
            _advance(s, trigger.id, t)
    except IntegrityError:
        _advance_alone(ctx, trigger.id, t)
        return
    except NotFound:
        return  # the worker was deleted since this tick read it: nothing is left to record
    log.info("schedule %s of %s at %s: %s", trigger.id, worker.name, t.isoformat(), message)


def _advance(s: Session, trigger_id: str, t: datetime) -> None:
    # Conditional, so a scheduler that handled an earlier tick never moves it back.
    s.exec(
        update(Trigger)
        .where(
            col(Trigger.id) == trigger_id,
            or_(col(Trigger.last_fire_at).is_(None), col(Trigger.last_fire_at) < t),
        )
        .values(last_fire_at=t)
    )


def _advance_alone(ctx: Context, trigger_id: str, t: datetime) -> None:
    """Another scheduler owns this tick; catch up with it so this one does not retry it."""
    with session_scope(ctx.engine, write=True) as s:
        _advance(s, trigger_id, t)


def _local(t: datetime, spec: ScheduleSpec) -> str:
    return t.astimezone(cron.zone(spec.timezone)).isoformat(timespec="minutes")


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
