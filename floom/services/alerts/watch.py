"""The alert watch: one pass reads what changed since the last (runs that ended, webhook and
Composio deliveries), and what is overdue now (approvals waiting, schedules whose tick did
not run, lost nodes), and records each thing once (floom/services/alerts/incidents.py).

Streams are read from a cursor kept in the store, with a margin behind it: a run whose end
committed a little after the time it records is still seen, and events already recorded are
skipped by their keys. A pass is idempotent, so every node with the api or scheduler role
runs it: the switch stays armed while any of them lives.

A node's loop passes a `Pace`, so that an idle pass costs one statement, not a score. That
statement (`_probe`) counts what changed since an anchor a margin back: runs ended, webhook
and Composio deliveries, approvals asked, triggers synced, nodes started, audited actions (a
worker deleted with its runs among them); with the anchor fixed, each count only grows, so
any change since the last pass shows as a count that differs, whichever node or process made
it (it also counts the approvals pending: one committed late may carry an older id). A pass
that sees a change runs every check, as a pass did before. One that sees none skips the
checks that read changes (runs, deliveries, run callbacks) and runs each of the checks that
come due with time (approvals waiting, schedules missed, late or stuck, nodes lost) only
once the deadline it computed at its last run has come: the earliest pending approval's
wait, each schedule's next tick and its run's grace, the earliest node lease. A change (a
new approval, a schedule synced, a node started) may bring a deadline nearer, which is why
any change makes the next pass a whole one. Deliveries are sent when the same statement
finds one due (or a whole pass may have queued one). A pass that sees the clock earlier than
the last one did starts afresh (anchor and deadlines were taken from the clock as it was),
and a cursor ahead of the clock is read from, and set back to, the clock's time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_
from sqlmodel import Session, col, select

from floom.services.alerts import callbacks, incidents
from floom.services.alerts.incidents import NOTICE, PROBLEM, RECOVERY, Seen
from floom.services.runs.rules import (
    FAILED,
    FINISHED,
    LIMIT_EXCEEDED,
    QUEUED,
    REJECTED,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
)
from floom.services.triggers.registry import spec_of
from floom.store.agents import Approval
from floom.store.audit import AuditEvent
from floom.store.db import database_now, db_now, session_scope
from floom.store.models import AlertCursor, Delivery, Run, Worker
from floom.store.nodes import Node
from floom.store.triggers import Trigger, TriggerFire, WebhookDelivery
from floom.triggers import cron
from floom.triggers.spec import ScheduleSpec
from floom.vocabulary import ApprovalStatus, DeliveryStatus, NodeState, TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.alerts")

# How far behind its cursor a pass reads again (a commit can land after the time it records).
MARGIN_SECONDS = 120.0
BATCH = 500
# A pass that read nothing past its cursor (only the margin behind it, read again) moves
# the cursor only once it is this far behind: the stretch read again stays short (the
# margin and this), and an idle node's passes (every FLOOM_ALERT_POLL_SECONDS) write
# nothing, where each wrote two cursors, and kept doing so for the margin after any change.
CURSOR_STEP = timedelta(seconds=60)
RUN_EVENTS = {
    FAILED: "run.failed",
    TIMED_OUT: "run.timed_out",
    LIMIT_EXCEEDED: "run.limit_exceeded",
    REJECTED: "run.rejected",
}
HOOK_FAILURES = ("input_invalid", "start_failed")
SKIPPED_AS_MISSED = ("missed", "start_failed")
FOREVER = datetime.max.replace(tzinfo=UTC)  # a timed check with nothing ahead


@dataclass
class Pace:
    """What a node's alert loop keeps from one pass to the next (see the module's docstring).
    `deliver` is set by each pass: whether deliveries may be due."""

    anchor: datetime | None = None  # the probe counts what happened since
    seen: tuple[int, ...] | None = None  # its counts at the last pass (None: look at all)
    due: dict[str, datetime] = field(default_factory=dict)  # a timed check's next deadline
    deliver: bool = True
    last: datetime | None = None  # the time the last pass judged by


# A timed check: (events recorded, when it must run again at the latest).
Timed = Callable[["Context", datetime], tuple[int, datetime]]


def watch(ctx: Context, *, now: datetime | None = None, pace: Pace | None = None) -> int:
    """One pass of every check (with `pace`, of those that may have something to say); how
    many events it recorded. Each check stands alone: one that fails is logged, the others
    still run, and it runs again at the next pass. `now` is the database's time unless
    given (tests drive the passes with the times they see)."""
    if pace is not None:
        whole, now, behind = _changed(ctx, pace, now)
    else:
        whole = True
        with session_scope(ctx.engine) as s:
            now = now or database_now(s)
            behind = _writers_behind(s)
    recorded = 0
    more = False
    if whole:
        for check in (_runs, _hooks):
            try:
                found, full = check(ctx, now, behind)
                recorded += found
                more |= full
            except Exception:  # one broken check must not silence the others
                more = True
                log.exception("alert check %s failed; trying again at the next pass", check)
    for name, timed in TIMED.items():
        if pace is not None and not whole and pace.due.get(name, now) > now:
            continue
        try:
            found, deadline = timed(ctx, now)
            recorded += found
            if pace is not None:
                pace.due[name] = deadline
        except Exception:  # as above
            if pace is not None:
                pace.due.pop(name, None)
            log.exception("alert check %s failed; trying again at the next pass", name)
    if whole:
        try:
            more |= callbacks.queue_ended(ctx) >= callbacks.BATCH
        except Exception:  # as above
            more = True
            log.exception("queueing run callbacks failed; trying again at the next pass")
    if pace is not None:
        # A pass that read a whole batch (or failed) leaves the rest to the next, whole, pass.
        if more:
            pace.seen = None
        pace.deliver = pace.deliver or whole
    return recorded


def _probe(
    s: Session, since: datetime, *, now: datetime | None = None
) -> tuple[tuple[int, ...], bool, datetime]:
    """What happened since `since`, counted: each count grows with each change of its kind
    committed since, whichever node made it, and falls only when rows so recent are deleted
    (a worker's, audited); and the approvals pending. Then whether a delivery is due, and the
    time it was judged at: `now`, or the database's."""
    micros = f"{max(0, int(since.timestamp() * 1_000_000)):014x}"
    at: Any = now if now is not None else db_now()

    def count(model: Any, *where: Any) -> Any:
        return select(func.count()).select_from(model).where(*where).scalar_subquery()

    columns = [
        count(Run, col(Run.finished_at) >= since),
        count(WebhookDelivery, col(WebhookDelivery.id) >= f"dlv_{micros}"),
        count(Approval, col(Approval.id) >= f"apr_{micros}"),
        # And those pending: an agent names its approval before it saves its workspace and
        # writes the row, so the id of one committed late may be older than the anchor; and
        # those decided, or one decided while one such is written would leave both as they
        # were.
        count(Approval, Approval.status == ApprovalStatus.PENDING),
        count(Approval, col(Approval.decided_at) >= since),
        count(AuditEvent, col(AuditEvent.id) >= f"aud_{micros}"),
        count(Trigger, col(Trigger.updated_at) >= since),
        count(Node, col(Node.started_at) >= since),
        select(Delivery.id)
        .where(
            Delivery.status == DeliveryStatus.PENDING,
            or_(col(Delivery.lease_expires_at).is_(None), col(Delivery.lease_expires_at) < at),
            col(Delivery.next_attempt_at) <= at,
        )
        .exists(),
    ]
    if now is None:
        columns.append(at)  # the time it judged by, in the same statement
    row = tuple(s.exec(select(*columns)).one())
    judged = now if now is not None else row[-1]
    *counts, due = row if now is not None else row[:-1]
    return tuple(int(x) for x in counts), bool(due), _aware(judged)


def _changed(ctx: Context, pace: Pace, now: datetime | None) -> tuple[bool, datetime, timedelta]:
    """Whether anything changed since the last pass (one statement; more when something did:
    the counts since a fresh anchor, read before the checks read anything); the time the
    pass judges by (`now`, or the database's, read by the same statement); how far the
    furthest-behind node's clock is (see `_writers_behind`), when the pass is a whole one.
    Sets `pace.deliver` from the same statement. A pass that sees an earlier time than the
    last one did starts afresh: the anchor and deadlines were taken from the clock as it was,
    and may be ahead of every time written from now on."""
    with session_scope(ctx.engine) as s:
        if pace.anchor is not None and pace.seen is not None:
            counts, due, now = _probe(s, pace.anchor, now=now)
            pace.deliver = due
            stepped_back = pace.last is not None and now < pace.last
            pace.last = now
            if counts == pace.seen and not stepped_back:
                return False, now, timedelta(0)
        now = now or database_now(s)
        if pace.last is not None and now < pace.last:
            pace.due = {}
        pace.last = now
        behind = _writers_behind(s)
        pace.anchor = now - timedelta(seconds=MARGIN_SECONDS) - behind
        pace.seen = _probe(s, pace.anchor, now=now)[0]
    pace.deliver = True
    return True, now, behind


def _writers_behind(s: Session) -> timedelta:
    """How far behind the database's clock the furthest-behind node's own clock was at its
    last heartbeat (nodes are forgotten a day after it): what such a node stamps (a run's
    end, a delivery's receipt, an id) is that much earlier than when it was written, so the
    watch reads back that much further (a node ahead stamps later: read again, not missed)."""
    rows = s.exec(
        select(Node.heartbeat_at, Node.heard_at).where(col(Node.heard_at).is_not(None))
    ).all()
    gaps = [_aware(heard) - _aware(beat) for beat, heard in rows if heard is not None]
    return max([timedelta(0), *gaps])


def _cursor(s: Session, name: str) -> datetime | None:
    row = s.get(AlertCursor, name)
    return row.at if row is not None else None


def _since(mark: datetime | None, now: datetime, behind: timedelta) -> datetime:
    """Where a pass reads from: the margin (and how far the furthest-behind node's clock is)
    behind its cursor, or behind `now` when there is none or it is ahead of `now` (set from
    a clock that has since stepped back: the times written from now on are behind it)."""
    return min(mark or now, now) - timedelta(seconds=MARGIN_SECONDS) - behind


def _moves(mark: datetime | None, read: list[datetime], now: datetime) -> bool:
    """Whether a pass that read rows at times `read` moves its cursor (at `mark`): when it
    read any and there is no cursor yet, when it read one past the cursor (not only the
    margin behind it, read again), when the cursor is CURSOR_STEP behind, or when it is ahead
    of `now` (it goes back to this pass's time, see `_since`)."""
    if mark is None:
        return bool(read)
    return any(at > mark for at in read) or now - mark >= CURSOR_STEP or mark > now


def _advance(ctx: Context, name: str, at: datetime, now: datetime) -> None:
    """Move the cursor on to `at`; or back to it when the cursor is ahead of `now`."""
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(AlertCursor, name)
        if row is None:
            s.add(AlertCursor(name=name, at=at))
        elif row.at < at or _aware(row.at) > now:
            row.at = at
            s.add(row)


def _record_all(ctx: Context, seen: list[Seen]) -> int:
    with session_scope(ctx.engine) as s:
        known = incidents.known_keys(s, [x.key for x in seen if x.what != RECOVERY])
    return sum(1 for x in seen if x.key not in known and incidents.record(ctx, x) is not None)


def watch_runs(ctx: Context, *, now: datetime) -> int:
    """Runs that ended failed, timed out, over a limit or rejected; and the successes that
    end an open incident of their worker."""
    return _runs(ctx, now, timedelta(0))[0]


def _runs(ctx: Context, now: datetime, behind: timedelta) -> tuple[int, bool]:
    """watch_runs; and whether more may wait (never: a pass reads a page after another until
    it has read everything since its cursor's margin; a page left to the next pass would be
    read from that margin again, and with more than a page of failures in it, no later one
    would ever be read)."""
    with session_scope(ctx.engine) as s:
        mark = _cursor(s, "runs")
    since = _since(mark, now, behind)
    recorded, newest, after = 0, None, None
    while True:
        found, ended = _runs_page(ctx, now, since, after)
        recorded += found
        if not ended:
            break
        last = ended[-1]
        newest = last.finished_at
        if len(ended) < BATCH or last.finished_at is None:
            break
        after = (last.finished_at, last.id)
    if _moves(mark, [newest] if newest else [], now):
        _advance(ctx, "runs", now, now)
    return recorded, False


def _runs_page(
    ctx: Context, now: datetime, since: datetime, after: tuple[datetime, str] | None
) -> tuple[int, list[Run]]:
    """A page of the runs that ended failed since `since` (after `after`, the last one read),
    with the successes of their workers, and of those with an open incident, in the same
    stretch of time; how many events were recorded, and the page's failures."""
    with session_scope(ctx.engine) as s:
        query = select(Run).where(
            col(Run.finished_at) >= since, col(Run.status).in_(sorted(RUN_EVENTS))
        )
        if after is not None:
            at, run_id = after
            query = query.where(
                or_(
                    col(Run.finished_at) > at,
                    and_(col(Run.finished_at) == at, col(Run.id) > run_id),
                )
            )
        ended = list(s.exec(query.order_by(col(Run.finished_at), col(Run.id)).limit(BATCH)).all())
        failing = {run.worker_name for run in ended} | {
            subject.removeprefix("worker:") for subject in incidents.open_subjects(s, "worker:")
        }
        stretch = [col(Run.finished_at) >= (after[0] if after is not None else since)]
        if len(ended) >= BATCH and ended[-1].finished_at is not None:
            stretch.append(col(Run.finished_at) <= ended[-1].finished_at)
        recovered = (
            list(
                s.exec(
                    select(Run)
                    .where(
                        *stretch,
                        Run.status == SUCCEEDED,
                        col(Run.worker_name).in_(sorted(failing)),
                    )
                    .order_by(col(Run.finished_at))
                    .limit(BATCH)
                ).all()
            )
            if failing
            else []
        )
    runs = sorted([*ended, *recovered], key=lambda r: (r.finished_at or now, r.id))
    return _record_all(ctx, [_run_seen(run, now) for run in runs]), ended


def _run_seen(run: Run, now: datetime) -> Seen:
    at = run.finished_at or now
    if run.status == SUCCEEDED:
        return Seen(
            key=f"run:{run.id}:recovered",
            kind="recovered",
            subject=f"worker:{run.worker_name}",
            what=RECOVERY,
            summary=f"worker {run.worker_name} recovered: run {run.id} succeeded",
            at=at,
            worker=run.worker_name,
            run_id=run.id,
        )
    kind = RUN_EVENTS[run.status]
    code = f" ({run.error_code})" if run.error_code else ""
    return Seen(
        key=f"run:{run.id}:ended",
        kind=kind,
        subject=f"worker:{run.worker_name}",
        what=PROBLEM,
        summary=f"worker {run.worker_name}: run {run.id} {run.status.replace('_', ' ')}{code}",
        at=at,
        worker=run.worker_name,
        run_id=run.id,
        error_code=run.error_code,
        message=run.error_message,
        details={"status": run.status, "trigger": run.trigger, "attempt": run.attempt},
    )


def watch_hooks(ctx: Context, *, now: datetime) -> int:
    """Verified webhook and Composio deliveries that could not start a run (and the next one
    of the same trigger that did, which ends the incident)."""
    return _hooks(ctx, now, timedelta(0))[0]


def _hooks(ctx: Context, now: datetime, behind: timedelta) -> tuple[int, bool]:
    """watch_hooks; and whether more may wait (never: a page after another, as `_runs`)."""
    with session_scope(ctx.engine) as s:
        mark = _cursor(s, "hooks")
    since = _since(mark, now, behind)
    recorded, newest, after = 0, None, None
    while True:
        with session_scope(ctx.engine) as s:
            query = select(WebhookDelivery).where(col(WebhookDelivery.received_at) >= since)
            if after is not None:
                at, row_id = after
                query = query.where(
                    or_(
                        col(WebhookDelivery.received_at) > at,
                        and_(
                            col(WebhookDelivery.received_at) == at, col(WebhookDelivery.id) > row_id
                        ),
                    )
                )
            rows = list(
                s.exec(
                    query.order_by(col(WebhookDelivery.received_at), col(WebhookDelivery.id)).limit(
                        BATCH
                    )
                ).all()
            )
        recorded += _record_all(ctx, [x for row in rows if (x := _hook_seen(row)) is not None])
        if not rows:
            break
        newest = rows[-1].received_at
        if len(rows) < BATCH:
            break
        after = (rows[-1].received_at, rows[-1].id)
    if _moves(mark, [newest] if newest else [], now):
        _advance(ctx, "hooks", now, now)
    return recorded, False


def _hook_seen(row: WebhookDelivery) -> Seen | None:
    subject = f"trigger:{row.trigger_id or row.source + ':' + row.worker_name}"
    worker = row.worker_name or None
    if row.outcome in HOOK_FAILURES:
        return Seen(
            key=f"hook:{row.id}",
            kind="trigger.failed",
            subject=subject,
            what=PROBLEM,
            summary=f"a {row.source} delivery to {row.worker_name or 'floom'} could not "
            f"start a run ({row.outcome})",
            at=row.received_at,
            worker=worker,
            run_id=row.run_id,
            error_code=row.outcome,
            message=row.message,
            details={"delivery_id": row.id, "source": row.source, "event": row.event},
        )
    if row.outcome == "run":
        return Seen(
            key=f"hook:{row.id}:recovered",
            kind="recovered",
            subject=subject,
            what=RECOVERY,
            summary=f"{row.source} deliveries to {row.worker_name} start runs again",
            at=row.received_at,
            worker=worker,
            run_id=row.run_id,
        )
    return None


def watch_approvals(ctx: Context, *, now: datetime) -> int:
    """Runs that have waited for a person longer than FLOOM_ALERT_APPROVAL_WAIT_SECONDS."""
    return _approvals(ctx, now)[0]


def _approvals(ctx: Context, now: datetime) -> tuple[int, datetime]:
    """watch_approvals; and when it can next find one: the earliest approval still pending
    and not yet overdue reaches its wait (a new one is a change, seen by the probe)."""
    wait = timedelta(seconds=ctx.settings.alert_approval_wait_seconds)
    before = now - wait
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Approval)
            .where(Approval.status == ApprovalStatus.PENDING, col(Approval.created_at) <= before)
            .order_by(col(Approval.id))
            .limit(BATCH)
        ).all()
        waiting = s.exec(
            select(func.min(Approval.created_at)).where(
                Approval.status == ApprovalStatus.PENDING, col(Approval.created_at) > before
            )
        ).one()
    seen = [
        Seen(
            key=f"approval:{row.id}:waiting",
            kind="approval.waiting",
            subject=f"approval:{row.id}",
            what=NOTICE,
            summary=f"worker {row.worker_name}: run {row.run_id} has waited for approval "
            f"{row.id} since {row.created_at.isoformat(timespec='seconds')}",
            at=now,
            worker=row.worker_name,
            run_id=row.run_id,
            details={"approval_id": row.id, "kind": row.kind},
        )
        for row in rows
    ]
    recorded = _record_all(ctx, seen)
    if len(rows) >= BATCH:
        return recorded, now
    return recorded, (_aware(waiting) + wait) if waiting is not None else FOREVER


def watch_schedules(ctx: Context, *, now: datetime) -> int:
    """The dead-man's switch: each schedule's next tick must have been handled within
    FLOOM_ALERT_SCHEDULE_GRACE_SECONDS (missed), its run started by then (late) and ended
    within FLOOM_ALERT_SCHEDULE_STUCK_SECONDS (stuck); its latest tick succeeding ends the
    incident."""
    return _schedules(ctx, now)[0]


def _schedules(ctx: Context, now: datetime) -> tuple[int, datetime]:
    """watch_schedules; and when it can next find something (`_schedule_seen`). Paused
    schedules and those of paused workers count for that too: their ticks move them on."""
    grace = timedelta(seconds=ctx.settings.alert_schedule_grace_seconds)
    stuck = timedelta(seconds=ctx.settings.alert_schedule_stuck_seconds)
    deadline = FOREVER
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
        seen: list[Seen] = []
        for trigger, worker in rows:
            spec = spec_of(trigger)
            if not isinstance(spec, ScheduleSpec):
                continue
            watched = not (trigger.paused or worker.paused)
            found, nearest = _schedule_seen(
                s, trigger, worker.name, spec, now=now, grace=grace, stuck=stuck, watched=watched
            )
            seen += found if watched else []
            deadline = min(deadline, nearest)
        # A schedule removed (or its worker deleted or left with no version) has no tick
        # that could close its incident: it closes now.
        gone = set(incidents.open_subjects(s, "schedule:")) - {f"schedule:{t.id}" for t, _ in rows}
    seen += [
        Seen(
            key=f"{subject}:gone",
            kind="recovered",
            subject=subject,
            what=RECOVERY,
            summary=f"schedule {subject.removeprefix('schedule:')} was removed",
            at=now,
            details={"trigger_id": subject.removeprefix("schedule:")},
        )
        for subject in sorted(gone)
    ]
    return _record_all(ctx, seen), deadline


def _schedule_seen(
    s: Session,
    trigger: Trigger,
    worker: str,
    spec: ScheduleSpec,
    *,
    now: datetime,
    grace: timedelta,
    stuck: timedelta,
    watched: bool = True,
) -> tuple[list[Seen], datetime]:
    """What the schedule's latest and next ticks show now; and the earliest time when that
    can change other than by a change the probe sees (a run's end, a sync): its next tick
    (from then until the scheduler has handled it, every pass), and while its latest tick's
    run has not ended, that tick plus the grace or the stuck time, whichever is first (after
    that, every pass: the run may start, stop or be queued again without any end)."""
    subject = f"schedule:{trigger.id}"
    where = f"schedule {spec.cron} ({spec.timezone}) of {worker}"

    def seen(kind: str, what: str, t: datetime, summary: str, run: Run | None = None) -> Seen:
        return Seen(
            key=f"{subject}:{t.isoformat()}:{kind}",
            kind=kind,
            subject=subject,
            what=what,
            summary=summary,
            at=now,  # when the watch saw it: the tick's time may be ahead of a run's end
            worker=worker,
            run_id=run.id if run else None,
            error_code=kind.split(".")[-1] if what == PROBLEM else None,
            details={"trigger_id": trigger.id, "scheduled_for": t.isoformat(), "cron": spec.cron},
        )

    found: list[Seen] = []
    try:
        base = trigger.last_fire_at or trigger.created_at
        upcoming = cron.next_fire_times(spec.cron, cron.zone(spec.timezone), after=base, count=1)
    except cron.CronError:
        return [], FOREVER
    nearest = upcoming[0] if upcoming else FOREVER
    if upcoming and upcoming[0] + grace <= now:
        t = upcoming[0]
        found.append(
            seen("schedule.missed", PROBLEM, t, f"{where}: the tick of {t.isoformat()} has not run")
        )
    if trigger.last_fire_at is None or not watched:
        return found, nearest
    t = trigger.last_fire_at
    fire = s.exec(
        select(TriggerFire).where(
            TriggerFire.trigger_id == trigger.id, TriggerFire.scheduled_for == t
        )
    ).first()
    if fire is None:
        return found, nearest
    if fire.outcome in SKIPPED_AS_MISSED:
        found.append(
            seen(
                "schedule.missed",
                PROBLEM,
                t,
                f"{where}: the tick of {t.isoformat()} was {fire.outcome.replace('_', ' ')}",
            )
        )
        return found, nearest
    run = s.get(Run, fire.run_id) if fire.run_id else None
    if run is None:
        return found, nearest
    if run.status not in FINISHED:
        nearest = min(nearest, max(t + min(grace, stuck), now))
    if run.status == QUEUED and t + grace <= now:
        found.append(
            seen(
                "schedule.late",
                PROBLEM,
                t,
                f"{where}: the run {run.id} of {t.isoformat()} has not started",
                run,
            )
        )
    elif run.status == RUNNING and t + stuck <= now:
        found.append(
            seen(
                "schedule.stuck",
                PROBLEM,
                t,
                f"{where}: the run {run.id} of {t.isoformat()} is still running",
                run,
            )
        )
    elif run.status == SUCCEEDED and not found:
        found.append(
            seen("recovered", RECOVERY, t, f"{where} runs again: run {run.id} succeeded", run)
        )
    return found, nearest


def watch_nodes(ctx: Context, *, now: datetime) -> int:
    """Nodes silent past their lease (lost), and lost nodes heard again (or stopped, or
    forgotten)."""
    return _nodes(ctx, now)[0]


def _nodes(ctx: Context, now: datetime) -> tuple[int, datetime]:
    """watch_nodes; and when it can next find something: the earliest lease of a live node
    runs out (a heartbeat only puts that off; a node started is a change the probe sees),
    or, while a node is lost or its incident open, at every pass (it may be heard again)."""
    with session_scope(ctx.engine) as s:
        nodes = s.exec(select(Node)).all()
        lost_open = incidents.open_subjects(s, "node:")
    seen = []
    deadline = now if lost_open else FOREVER
    for node in nodes:
        subject = f"node:{node.id}"
        # Judged on the database's clock, as `now` is: a node whose own clock is off is
        # neither lost while it beats nor live after it stopped.
        heard = _aware(node.heard_at or node.heartbeat_at)
        lease = timedelta(seconds=node.lease_seconds)
        if node.stopped_at is not None:
            state = NodeState.STOPPED
        else:
            state = NodeState.LIVE if now - heard <= lease else NodeState.LOST
        if state == NodeState.LIVE:
            deadline = min(deadline, heard + lease)
        if state == NodeState.LOST:
            deadline = now
            seen.append(
                Seen(
                    key=f"{subject}:{node.heartbeat_at.isoformat()}:lost",
                    kind="node.lost",
                    subject=subject,
                    what=PROBLEM,
                    summary=f"node {node.id} ({node.roles}) has been silent since "
                    f"{node.heartbeat_at.isoformat(timespec='seconds')}",
                    at=now,
                    error_code="node_lost",
                    details={"node": node.id, "roles": node.roles, "hostname": node.hostname},
                )
            )
        elif subject in lost_open:
            seen.append(
                Seen(
                    key=f"{subject}:back",
                    kind="recovered",
                    subject=subject,
                    what=RECOVERY,
                    summary=f"node {node.id} is "
                    + ("back" if state == NodeState.LIVE else "stopped cleanly"),
                    at=now,
                    details={"node": node.id},
                )
            )
    # A node silent for a day is forgotten (its row deleted when another node starts): its
    # incident closes, else it stays open, and this check runs every pass, for good.
    for subject in sorted(set(lost_open) - {f"node:{node.id}" for node in nodes}):
        node_id = subject.removeprefix("node:")
        seen.append(
            Seen(
                key=f"{subject}:forgotten",
                kind="recovered",
                subject=subject,
                what=RECOVERY,
                summary=f"node {node_id} is forgotten: silent for over a day, it no longer "
                "counts as a node of this floom",
                at=now,
                details={"node": node_id},
            )
        )
    return _record_all(ctx, seen), deadline


# The checks that come due with time, by name (Pace.due's keys).
TIMED: dict[str, Timed] = {"approvals": _approvals, "schedules": _schedules, "nodes": _nodes}


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
