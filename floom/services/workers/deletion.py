"""Deleting a worker: its triggers stop, its unfinished runs are cancelled, and its runs are
kept (readable under its name) or purged with everything they left behind. Audited.

Secrets are global by name, so they stay. A later deploy of the same name is a new worker:
no versions, triggers, memory, state or webhook deliveries carry over.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, update
from sqlmodel import Session, col, select

from floom.errors import Conflict, InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.services.access import audit, principal
from floom.services.access.audit import AuditActor
from floom.services.access.principal import Principal
from floom.services.handoffs.bridge import agent_label
from floom.services.ops.retention import delete_objects_now
from floom.services.runs import approvals
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.services.runs import waits as run_waits
from floom.services.triggers import webhooks
from floom.services.workers import versions as workers
from floom.store.agents import Approval, MemoryEntry, ToolCall, Transcript
from floom.store.blobs.rows import delete_unreferenced_blobs
from floom.store.blobs.tables import HeldBack, RunLog
from floom.store.db import session_scope
from floom.store.handoffs import Agent, AgentRole
from floom.store.models import Artifact, Run, RunEvent, Version, Worker, WorkerState, utcnow
from floom.store.triggers import Trigger, TriggerFire, WebhookDelivery

if TYPE_CHECKING:
    from floom.services.context import Context

# How long a purge waits for the worker's running runs to stop after asking them to.
STOP_WAIT_SECONDS = 20.0
# Rounds of cancelling runs a trigger queued while the deletion was getting ready.
_ROUNDS = 3
# Version ids per statement when purging.
_CHUNK = 500
# Runs a deletion must cancel or stop first: queued, running or waiting for approval.
_NOT_FINISHED = sorted(run_rules.ACTIVE | run_rules.WAITING)


@dataclass(frozen=True)
class Deletion:
    """What a deletion did, as the API answers it and the audit event records it."""

    worker: str
    deletion_id: str
    purge_runs: bool
    versions: list[str]
    active_version_id: str | None
    runs_kept: int = 0
    runs_purged: int = 0
    # Queued or waiting-for-approval runs that ended cancelled at once.
    runs_cancelled: int = 0
    # Running runs asked to stop; each ends as cancelled once its executor kills it.
    runs_stopping: int = 0
    triggers_removed: int = 0
    approvals_closed: int = 0
    webhook_deliveries_deleted: int = 0
    blobs_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Unsettled(Exception):
    """Runs that must be cancelled first appeared while the deletion's transaction began."""


def delete_worker(
    ctx: Context,
    *,
    name: str,
    purge_runs: bool,
    caller: Principal,
    confirm_name: str | None = None,
    stop_wait_seconds: float = STOP_WAIT_SECONDS,
) -> Deletion:
    """Delete the worker `name` and stop everything that could start it again, at once.

    Its queued and paused runs are cancelled (pending approvals closed with them) before the
    deletion; running ones are asked to stop and end as cancelled. With `purge_runs`, the
    deletion waits up to `stop_wait_seconds` for them to end, then removes the runs with
    their logs, artifacts, tool calls, approvals, transcripts and versions, and the blobs no
    one else refers to; if a run is still running then, it raises Conflict and deletes
    nothing. Without it, runs and versions stay readable; the versions are retired from the
    name. One transaction deletes everything, with the audit event; unknown names raise
    NotFound. Needs the deploy scope, read again from the caller's key before the first
    cancel and inside the deleting transaction; `confirm_name`, when given (a person typed
    it to confirm), must be the worker's name, or nothing is deleted.
    """
    caller.require("deploy")
    if confirm_name is not None and confirm_name.strip() != name:
        raise InvalidRequest(
            "the name typed does not match; nothing was deleted",
            hint=f"type {name} into the box to confirm",
        )
    actor = AuditActor.of(caller)
    with session_scope(ctx.engine) as s:
        caller.require_in(s, "deploy")  # a revoked key cancels nothing
    workers.get_worker(ctx, name=name, caller=caller)
    label = f"deletion of worker {name} by {actor.label}"
    cancelled = closed = 0
    for _ in range(_ROUNDS):
        more, approvals_closed = _cancel_unfinished(ctx, name=name, actor=label)
        cancelled, closed = cancelled + more, closed + approvals_closed
        if purge_runs:
            _wait_for_running(ctx, name=name, timeout=stop_wait_seconds)
        try:
            with session_scope(ctx.engine, write=True) as s:
                caller.require_in(s, "deploy")
                result = _delete(
                    s,
                    name=name,
                    purge_runs=purge_runs,
                    actor=actor,
                    label=label,
                    cancelled=cancelled,
                    approvals_closed=closed,
                )
        except _Unsettled:
            continue
        workers.forget_versions(result.versions)
        if result.blobs_deleted:
            delete_objects_now(ctx)
        return result
    raise Conflict(
        f"runs of '{name}' keep being started while it is being deleted",
        hint=told("pause it first (", act("pause", worker=name), "), then delete it"),
    )


def _cancel_unfinished(ctx: Context, *, name: str, actor: str) -> tuple[int, int]:
    """Cancel the worker's unfinished runs through the runs service, one at a time, so every
    rule of cancelling holds (pending approvals close with their run); running ones are asked
    to stop. Returns (runs that ended cancelled at once, approvals closed)."""
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Run.id, Run.cancel_requested).where(
                Run.worker_name == name,
                col(Run.status).in_(_NOT_FINISHED),
            )
        ).all()
        pending = _count(s, _pending_approvals(name))
    cancelled = 0
    for run_id, requested in rows:
        if requested:
            continue
        try:
            # The deletion was allowed (deploy scope); its cancels are floom's, by its label.
            stopped = runs.cancel_run(ctx, run_id=run_id, caller=principal.system(actor))
            cancelled += stopped.status == run_rules.CANCELLED
        except Conflict:
            pass  # it ended meanwhile
    with session_scope(ctx.engine) as s:
        still = _count(s, _pending_approvals(name))
    return cancelled, max(0, pending - still)


def _pending_approvals(name: str) -> Any:
    return (
        select(func.count())
        .select_from(Approval)
        .where(Approval.worker_name == name, Approval.status == approvals.PENDING)
    )


def _wait_for_running(ctx: Context, *, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with session_scope(ctx.engine) as s:
            left = s.exec(
                select(Run.id).where(Run.worker_name == name, Run.status == run_rules.RUNNING)
            ).first()
        if left is None:
            return
        left_seconds = max(0.0, deadline - time.monotonic())
        run_waits.wait_for_end_blocking(
            ctx, run_id=left, timeout=left_seconds, caller=principal.SYSTEM
        )


def _delete(
    s: Session,
    *,
    name: str,
    purge_runs: bool,
    actor: AuditActor,
    label: str,
    cancelled: int,
    approvals_closed: int,
) -> Deletion:
    # Locked first: a run being created for the worker now waits for this transaction.
    worker = s.get(Worker, name, with_for_update=True, populate_existing=True)
    if worker is None:
        raise NotFound(f"no worker named '{quoted(name)}'", hint="it was deleted meanwhile")
    active = s.exec(
        select(Run).where(Run.worker_name == name, col(Run.status).in_(_NOT_FINISHED))
    ).all()
    if any(r.status != run_rules.RUNNING or not r.cancel_requested for r in active):
        raise _Unsettled  # started after the cancelling pass: cancel those too, then retry
    running = [r for r in active if r.status == run_rules.RUNNING]
    for run_id in s.exec(
        select(Approval.run_id).where(
            Approval.worker_name == name, Approval.status == approvals.PENDING
        )
    ).all():
        approvals.withdraw_pending(s, run_id=run_id, actor=label)
        approvals_closed += 1
    if purge_runs and running:
        raise Conflict(
            f"{len(running)} run(s) of '{name}' did not stop in time to be purged",
            hint="try again in a few seconds, or delete it without purging: running runs "
            "then end as cancelled and its runs stay readable",
            details={"running": [r.id for r in running]},
        )
    deletion_id = audit.new_event_id()
    versions = list(s.exec(select(Version.id).where(Version.worker_name == name)).all())
    trigger_ids = select(Trigger.id).where(Trigger.worker_name == name)
    triggers_live = _count(
        s,
        select(func.count())
        .select_from(Trigger)
        .where(Trigger.worker_name == name, col(Trigger.removed_at).is_(None)),
    )
    # The tombstones first: how long each key must stay depends on its trigger's scheme.
    webhooks.keep_tombstones(s, worker_name=name, now=utcnow())
    s.execute(delete(TriggerFire).where(col(TriggerFire.trigger_id).in_(trigger_ids)))
    s.execute(delete(Trigger).where(col(Trigger.worker_name) == name))
    deliveries = s.execute(delete(WebhookDelivery).where(col(WebhookDelivery.worker_name) == name))
    s.execute(delete(MemoryEntry).where(col(MemoryEntry.worker_name) == name))
    s.execute(delete(WorkerState).where(col(WorkerState.worker_name) == name))
    agent_ids = select(Agent.id).where(Agent.label == agent_label(name))
    s.execute(delete(AgentRole).where(col(AgentRole.agent_id).in_(agent_ids)))
    run_count = _count(s, select(func.count()).select_from(Run).where(Run.worker_name == name))
    blobs_deleted = 0
    if purge_runs:
        blobs_deleted = _purge_runs(s, name=name)
    else:
        s.execute(
            update(Version)
            .where(col(Version.worker_name) == name)
            .values(worker_name=workers.retired_owner(deletion_id))
        )
    s.delete(worker)
    result = Deletion(
        worker=name,
        deletion_id=deletion_id,
        purge_runs=purge_runs,
        versions=versions,
        active_version_id=worker.active_version_id,
        runs_kept=0 if purge_runs else run_count,
        runs_purged=run_count if purge_runs else 0,
        runs_cancelled=cancelled,
        runs_stopping=len(running),
        triggers_removed=triggers_live,
        approvals_closed=approvals_closed,
        webhook_deliveries_deleted=int(getattr(deliveries, "rowcount", 0) or 0),
        blobs_deleted=blobs_deleted,
    )
    audit.record(
        s,
        type=audit.WORKER_DELETED,
        actor=actor,
        subject=f"worker:{name}",
        payload=result.to_dict(),
        event_id=deletion_id,
    )
    return result


def _purge_runs(s: Session, *, name: str) -> int:
    """Remove the worker's runs and all they refer to; returns how many blobs went."""
    run_ids = select(Run.id).where(Run.worker_name == name)
    digests: set[str] = set(
        s.exec(select(Artifact.digest).where(col(Artifact.run_id).in_(run_ids))).all()
    )
    digests.update(
        d
        for d in s.exec(
            select(Transcript.workspace_digest).where(col(Transcript.run_id).in_(run_ids))
        ).all()
        if d
    )
    digests.update(s.exec(select(RunLog.digest).where(col(RunLog.run_id).in_(run_ids))).all())
    # The worker's versions, and versions retired by an earlier deletion of the same name
    # that only these runs still use.
    version_ids = set(s.exec(select(Version.id).where(Version.worker_name == name)).all())
    used = set(s.exec(select(Run.version_id).where(Run.worker_name == name)).all())
    retired = s.exec(
        select(Version.id).where(
            col(Version.id).in_(used),
            col(Version.worker_name).startswith(workers.RETIRED_PREFIX),
        )
    ).all()
    version_ids.update(retired)
    still_used = set(
        s.exec(
            select(Run.version_id).where(
                Run.worker_name != name, col(Run.version_id).in_(version_ids)
            )
        ).all()
    )
    version_ids -= still_used
    for chunk in _chunks(version_ids):
        digests.update(s.exec(select(Version.digest).where(col(Version.id).in_(chunk))).all())
        s.execute(delete(Version).where(col(Version.id).in_(chunk)))
    for table in (RunEvent, RunLog, HeldBack, Artifact, ToolCall, Approval, Transcript):
        s.execute(delete(table).where(col(table.run_id).in_(run_ids)))
    s.execute(delete(Run).where(col(Run.worker_name) == name))
    return delete_unreferenced_blobs(s, digests)


def _chunks(items: set[str]) -> list[list[str]]:
    ordered = sorted(items)
    return [ordered[i : i + _CHUNK] for i in range(0, len(ordered), _CHUNK)]


def _count(s: Session, q: Any) -> int:
    return int(s.exec(q).one())
