"""The alert watch: one pass reads what changed since the last (runs that ended, webhook and
Composio deliveries), and what is overdue now (approvals waiting, schedules whose tick did
not run, lost nodes), and records each thing once (floom/services/alerts/incidents.py).

Streams are read from a cursor kept in the store, with a margin behind it: a run whose end
committed a little after the time it records is still seen, and events already recorded are
skipped by their keys. A pass is idempotent, so every node with the api or scheduler role
runs it: the switch stays armed while any of them lives.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from floom.services.alerts import callbacks, incidents
from floom.services.alerts.incidents import NOTICE, PROBLEM, RECOVERY, Seen
from floom.services.ops.nodes import state_of
from floom.services.runs.rules import (
    FAILED,
    LIMIT_EXCEEDED,
    QUEUED,
    REJECTED,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
)
from floom.services.triggers.registry import spec_of
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.store.models import AlertCursor, Run, Worker, utcnow
from floom.store.nodes import Node
from floom.store.triggers import Trigger, TriggerFire, WebhookDelivery
from floom.triggers import cron
from floom.triggers.spec import ScheduleSpec
from floom.vocabulary import ApprovalStatus, NodeState, TriggerKind

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


def watch(ctx: Context, *, now: datetime | None = None) -> int:
    """One pass of every check; how many events it recorded. Each check stands alone: one
    that fails is logged and the others still run."""
    now = now or utcnow()
    recorded = 0
    for check in (watch_runs, watch_hooks, watch_approvals, watch_schedules, watch_nodes):
        try:
            recorded += check(ctx, now=now)
        except Exception:  # one broken check must not silence the others
            log.exception("alert check %s failed; trying again at the next pass", check.__name__)
    try:
        callbacks.queue_ended(ctx)
    except Exception:  # as above
        log.exception("queueing run callbacks failed; trying again at the next pass")
    return recorded


def _cursor(s: Session, name: str) -> datetime | None:
    row = s.get(AlertCursor, name)
    return row.at if row is not None else None


def _moves(mark: datetime | None, read: list[datetime], now: datetime) -> bool:
    """Whether a pass that read rows at times `read` moves its cursor (at `mark`): when it
    read any and there is no cursor yet, when it read one past the cursor (not only the
    margin behind it, read again), or when the cursor is CURSOR_STEP behind."""
    if mark is None:
        return bool(read)
    return any(at > mark for at in read) or now - mark >= CURSOR_STEP


def _advance(ctx: Context, name: str, at: datetime) -> None:
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(AlertCursor, name)
        if row is None:
            s.add(AlertCursor(name=name, at=at))
        elif row.at < at:
            row.at = at
            s.add(row)


def _record_all(ctx: Context, seen: list[Seen]) -> int:
    with session_scope(ctx.engine) as s:
        known = incidents.known_keys(s, [x.key for x in seen if x.what != RECOVERY])
    return sum(1 for x in seen if x.key not in known and incidents.record(ctx, x) is not None)


def watch_runs(ctx: Context, *, now: datetime) -> int:
    """Runs that ended failed, timed out, over a limit or rejected; and the successes that
    end an open incident of their worker."""
    with session_scope(ctx.engine) as s:
        mark = _cursor(s, "runs")
        since = (mark or now) - timedelta(seconds=MARGIN_SECONDS)
        ended = list(
            s.exec(
                select(Run)
                .where(col(Run.finished_at) >= since, col(Run.status).in_(sorted(RUN_EVENTS)))
                .order_by(col(Run.finished_at))
                .limit(BATCH)
            ).all()
        )
        failing = {run.worker_name for run in ended} | {
            subject.removeprefix("worker:") for subject in incidents.open_subjects(s, "worker:")
        }
        recovered = (
            list(
                s.exec(
                    select(Run)
                    .where(
                        col(Run.finished_at) >= since,
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
    seen = [_run_seen(run, now) for run in runs]
    recorded = _record_all(ctx, seen)
    if _moves(mark, [run.finished_at for run in ended if run.finished_at], now):
        if len(ended) < BATCH:
            _advance(ctx, "runs", now)
        elif ended[-1].finished_at is not None:
            _advance(ctx, "runs", ended[-1].finished_at)
    return recorded


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
    with session_scope(ctx.engine) as s:
        mark = _cursor(s, "hooks")
        since = (mark or now) - timedelta(seconds=MARGIN_SECONDS)
        rows = list(
            s.exec(
                select(WebhookDelivery)
                .where(col(WebhookDelivery.received_at) >= since)
                .order_by(col(WebhookDelivery.received_at))
                .limit(BATCH)
            ).all()
        )
    seen = []
    for row in rows:
        subject = f"trigger:{row.trigger_id or row.source + ':' + row.worker_name}"
        worker = row.worker_name or None
        if row.outcome in HOOK_FAILURES:
            seen.append(
                Seen(
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
            )
        elif row.outcome == "run":
            seen.append(
                Seen(
                    key=f"hook:{row.id}:recovered",
                    kind="recovered",
                    subject=subject,
                    what=RECOVERY,
                    summary=f"{row.source} deliveries to {row.worker_name} start runs again",
                    at=row.received_at,
                    worker=worker,
                    run_id=row.run_id,
                )
            )
    recorded = _record_all(ctx, seen)
    if _moves(mark, [row.received_at for row in rows], now):
        _advance(ctx, "hooks", now if len(rows) < BATCH else rows[-1].received_at)
    return recorded


def watch_approvals(ctx: Context, *, now: datetime) -> int:
    """Runs that have waited for a person longer than FLOOM_ALERT_APPROVAL_WAIT_SECONDS."""
    before = now - timedelta(seconds=ctx.settings.alert_approval_wait_seconds)
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Approval)
            .where(Approval.status == ApprovalStatus.PENDING, col(Approval.created_at) <= before)
            .order_by(col(Approval.id))
            .limit(BATCH)
        ).all()
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
    return _record_all(ctx, seen)


def watch_schedules(ctx: Context, *, now: datetime) -> int:
    """The dead-man's switch: each schedule's next tick must have been handled within
    FLOOM_ALERT_SCHEDULE_GRACE_SECONDS (missed), its run started by then (late) and ended
    within FLOOM_ALERT_SCHEDULE_STUCK_SECONDS (stuck); its latest tick succeeding ends the
    incident."""
    grace = timedelta(seconds=ctx.settings.alert_schedule_grace_seconds)
    stuck = timedelta(seconds=ctx.settings.alert_schedule_stuck_seconds)
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Trigger, Worker)
            .join(Worker, col(Worker.name) == col(Trigger.worker_name))
            .where(
                Trigger.kind == TriggerKind.SCHEDULE,
                col(Trigger.removed_at).is_(None),
                col(Trigger.paused).is_(False),
                col(Worker.paused).is_(False),
                col(Worker.active_version_id).is_not(None),
            )
        ).all()
        seen: list[Seen] = []
        for trigger, worker in rows:
            spec = spec_of(trigger)
            if not isinstance(spec, ScheduleSpec):
                continue
            seen += _schedule_seen(s, trigger, worker.name, spec, now=now, grace=grace, stuck=stuck)
    return _record_all(ctx, seen)


def _schedule_seen(
    s: Session,
    trigger: Trigger,
    worker: str,
    spec: ScheduleSpec,
    *,
    now: datetime,
    grace: timedelta,
    stuck: timedelta,
) -> list[Seen]:
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
        return []
    if upcoming and upcoming[0] + grace <= now:
        t = upcoming[0]
        found.append(
            seen("schedule.missed", PROBLEM, t, f"{where}: the tick of {t.isoformat()} has not run")
        )
    if trigger.last_fire_at is None:
        return found
    t = trigger.last_fire_at
    fire = s.exec(
        select(TriggerFire).where(
            TriggerFire.trigger_id == trigger.id, TriggerFire.scheduled_for == t
        )
    ).first()
    if fire is None:
        return found
    if fire.outcome in SKIPPED_AS_MISSED:
        found.append(
            seen(
                "schedule.missed",
                PROBLEM,
                t,
                f"{where}: the tick of {t.isoformat()} was {fire.outcome.replace('_', ' ')}",
            )
        )
        return found
    run = s.get(Run, fire.run_id) if fire.run_id else None
    if run is None:
        return found
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
    return found


def watch_nodes(ctx: Context, *, now: datetime) -> int:
    """Nodes silent past their lease (lost), and lost nodes heard again (or stopped)."""
    with session_scope(ctx.engine) as s:
        nodes = s.exec(select(Node)).all()
        lost_open = incidents.open_subjects(s, "node:")
    seen = []
    for node in nodes:
        subject = f"node:{node.id}"
        state = NodeState.STOPPED if node.stopped_at is not None else state_of(node, now=now)[0]
        if state == NodeState.LOST:
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
    return _record_all(ctx, seen)
