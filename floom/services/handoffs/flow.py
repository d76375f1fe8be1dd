"""How handoff jobs move: claims with leases, status changes through the one transition
table, completion (dependents, routing), rejection into linked retries, and lease expiry.

Concurrency: claim_next locks with FOR UPDATE SKIP LOCKED on PostgreSQL, so racing agents
each get a different job; on SQLite the write lock serialises the step. A completing
blocker locks each dependent row before counting its open blockers, so of two blockers
completing at once the later one sees the earlier's commit and publishes exactly once.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from floom.errors import Conflict, Forbidden, InvalidRequest, quoted
from floom.hints import act, told
from floom.services import wakeups
from floom.services.access.principal import Principal
from floom.services.handoffs import rules
from floom.services.handoffs.agents import Actor, as_actor, system_actor
from floom.services.handoffs.jobs import (
    JobRecord,
    job_record,
    load_visible,
    record,
    routing_rules,
)
from floom.store.db import database_clock, session_scope
from floom.store.handoffs import Job, JobDependency, Role
from floom.store.models import new_id

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_LEASE_SECONDS = 24 * 3600
_STATUS_EVENTS: dict[str, str] = {
    rules.BLOCKED: "blocked",
    rules.IN_PROGRESS: "unblocked",
    rules.PUBLISHED: "released",
    rules.FAILED: "failed",
    rules.CANCELLED: "cancelled",
}


class NotHolder(Conflict):
    """The caller does not hold this job (any more)."""

    code = "not_holder"


class LeaseExpired(NotHolder):
    """The caller's lease on this job ran out; the job is being returned to the queue."""

    code = "lease_expired"


class AlreadyClaimed(Conflict):
    """Another agent holds this job."""

    code = "already_claimed"


def transitions_table() -> dict[str, Any]:
    """The transition table as data, for clients and the UI to show (never to decide)."""
    return {
        "statuses": list(rules.STATUSES),
        "transitions": {
            src: {dst: sorted(who) for dst, who in moves.items()}
            for src, moves in rules.TRANSITIONS.items()
        },
    }


def parties(actor: Actor, job: Job) -> set[str]:
    """The parts the actor plays for this job, as the transition table names them."""
    found = {rules.SYSTEM} if actor.system else set()
    if actor.agent_id is not None:
        if actor.agent_id == job.source_agent_id:
            found.add(rules.SOURCE)
        if actor.agent_id == job.assignee_agent_id:
            found.add(rules.ASSIGNEE)
        if job.target_role_id in actor.roles:
            found.add(rules.ROLE)
    if actor.key_id is not None and actor.key_id == job.created_by_key:
        found.add(rules.SOURCE)
    return found


def _lease(ctx: Context, lease_seconds: float | None) -> timedelta:
    seconds = ctx.settings.handoff_lease_seconds if lease_seconds is None else lease_seconds
    if not 0 < seconds <= MAX_LEASE_SECONDS:
        raise InvalidRequest(
            f"a lease is between 1 second and {MAX_LEASE_SECONDS} seconds",
            hint="heartbeat to extend a lease instead of asking for a long one",
        )
    return timedelta(seconds=seconds)


def _move(
    s: Session,
    job: Job,
    new: str,
    *,
    actor: Actor,
    event: str,
    reason: str | None = None,
    lease: timedelta | None = None,
    payload: dict[str, Any] | None = None,
) -> None:
    """The one place a job's status changes: checked against the table, then audited. Its
    times (and a lease's end) are on the database's clock, as every node judges them."""
    before = job.status
    job.status = rules.check_transition(before, new, parties=parties(actor, job), admin=actor.admin)
    now = database_clock(s.get_bind()).now()
    job.updated_at = now
    if new == rules.IN_PROGRESS:
        if before == rules.PUBLISHED:
            job.assignee_agent_id = actor.agent_id
            job.claimed_at = now
        job.lease_expires_at = now + (lease or timedelta(seconds=600))
        wakeups.HANDOFFS.notify_on_commit(s)  # the lease reaper has a lease to watch
    elif new == rules.PUBLISHED:
        job.assignee_agent_id = None
        job.claimed_at = None
        job.lease_expires_at = None
    else:
        # Blocked work waits on someone else, so it holds no lease; final jobs neither.
        job.lease_expires_at = None
    if new in rules.TERMINAL:
        job.finished_at = now
    if reason is not None:
        job.reason = reason
    s.add(job)
    body = dict(payload or {})
    if reason is not None:
        body["reason"] = reason
    if job.lease_expires_at is not None:
        body["lease_expires_at"] = job.lease_expires_at.isoformat()
    record(s, job, type=event, actor=actor, before=before, payload=body)


def _lock(s: Session, job_id: str) -> Job | None:
    q = select(Job).where(Job.id == job_id).with_for_update()
    return s.exec(q.execution_options(populate_existing=True)).first()


def _need_agent(actor: Actor) -> str:
    if actor.agent_id is None:
        raise Forbidden(
            "only an agent can hold a job; this is an admin key without an agent",
            hint=told(
                "use the key of an agent holding the job's role (", act("agents create"), ")"
            ),
        )
    return actor.agent_id


def _check_lease(s: Session, job: Job, actor: Actor) -> bool:
    """Whether `actor` holds `job`; NotHolder when it acts under a claim (Actor.claim) that
    is no longer the job's; LeaseExpired when it did, but its lease ran out. Checked
    under the row lock the caller took: a lease that ran out is lost now, not when the
    reaper next runs (it returns the job to published). Judged on the database's clock (its
    earliest reading): the lease was written by whichever node took the claim."""
    holder = actor.agent_id is not None and job.assignee_agent_id == actor.agent_id
    if holder and actor.claim is not None and job.claimed_at != actor.claim:
        raise NotHolder(
            f"you do not hold job {job.id} under this claim: it was claimed again since (the "
            "lease of this claim ran out), so what was started under it neither moves nor "
            "finishes the job",
            hint="the job is finished under its newer claim",
            details={"status": job.status},
        )
    expires = job.lease_expires_at if job.status == rules.IN_PROGRESS else None
    if holder and expires is not None and expires <= database_clock(s.get_bind()).earliest():
        wakeups.HANDOFFS.notify()
        raise LeaseExpired(
            f"your lease on job {job.id} expired at {expires.isoformat()}; "
            "the job is being returned to the queue",
            hint="claim it again once it is published, and heartbeat before the lease runs out",
            details={"status": job.status},
        )
    return holder


def _check_holder(s: Session, job: Job, actor: Actor) -> None:
    holder = _check_lease(s, job, actor)
    if actor.admin or holder:
        return
    held = " and another agent holds it" if job.assignee_agent_id else ""
    raise NotHolder(
        f"you do not hold job {job.id}: it is {job.status}{held}",
        hint="a lease that expires returns the job to published; claim it again if it is",
        details={"status": job.status},
    )


# -- claims and leases -----------------------------------------------------------------------


def _claim_locked(s: Session, job: Job, actor: Actor, lease: timedelta) -> None:
    _need_agent(actor)
    if job.status in (rules.IN_PROGRESS, rules.BLOCKED):
        raise AlreadyClaimed(
            f"job {job.id} is {job.status} and held by another agent",
            hint=told(act("handoffs claim-next"), " takes the next free job of your roles"),
            details={"status": job.status},
        )
    # Any other status is refused by the transition table, which names the allowed moves.
    _move(s, job, rules.IN_PROGRESS, actor=actor, event="claimed", lease=lease)


def claim(
    ctx: Context, *, actor: Actor | Principal, job_id: str, lease_seconds: float | None = None
) -> JobRecord:
    """Claim one published job; the caller holds it until its lease runs out."""
    who, lease = as_actor(ctx, actor, scope="run"), _lease(ctx, lease_seconds)
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        _claim_locked(s, job, who, lease)
        return job_record(s, job)


def claim_next(
    ctx: Context,
    *,
    actor: Actor | Principal,
    role: str | None = None,
    lease_seconds: float | None = None,
) -> JobRecord | None:
    """Claim the most urgent, then oldest, published job of the caller's roles (or of one
    of them), or None when there is none. Jobs another claim holds are skipped, not waited
    for: a racing loser gets the next job."""
    who, lease = as_actor(ctx, actor, scope="run"), _lease(ctx, lease_seconds)
    _need_agent(who)
    role_ids = who.role_ids
    if role is not None:
        role_ids = {rid for rid, name in who.roles.items() if role in (rid, name)}
        if not role_ids:
            raise Forbidden(
                f"you do not hold the role '{quoted(role)}'",
                hint=f"your roles: {', '.join(sorted(who.roles.values())) or 'none'}",
            )
    if not role_ids:
        return None
    q = (
        select(Job)
        .where(Job.status == rules.PUBLISHED, col(Job.target_role_id).in_(role_ids))
        .order_by(col(Job.priority_rank).desc(), col(Job.id))
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    with session_scope(ctx.engine, write=True) as s:
        job = s.exec(q).first()
        if job is None:
            return None
        _claim_locked(s, job, who, lease)
        return job_record(s, job)


def heartbeat(
    ctx: Context, *, actor: Actor | Principal, job_id: str, lease_seconds: float | None = None
) -> dict[str, Any]:
    """Extend the lease on a job the caller holds. Not an audit event: heartbeats would
    drown the trail; the lease's loss is recorded instead."""
    who, lease = as_actor(ctx, actor, scope="run"), _lease(ctx, lease_seconds)
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        _check_holder(s, job, who)
        if job.status == rules.IN_PROGRESS:
            job.lease_expires_at = database_clock(ctx.engine).now() + lease
            s.add(job)
        elif job.status != rules.BLOCKED:
            raise NotHolder(
                f"job {job_id} is {job.status}; there is no lease to extend",
                hint="claim a published job first",
                details={"status": job.status},
            )
        return {"id": job.id, "status": job.status, "lease_expires_at": job.lease_expires_at}


def any_lease_held(ctx: Context) -> bool:
    """Whether any job holds a lease (is in progress): the lease reaper sleeps while none
    does, until a job takes one (wakeups.HANDOFFS)."""
    with session_scope(ctx.engine) as s:
        q = select(Job.id).where(Job.status == rules.IN_PROGRESS).limit(1)
        return s.exec(q).first() is not None


def reap_expired_leases(ctx: Context) -> int:
    """Return jobs whose assignee stopped heartbeating to `published`. Returns how many.
    Judged on the database's clock (its earliest reading), as the leases were written: a
    node whose own clock is minutes off takes no job still held, and leaves none stuck."""
    reaper = system_actor("lease reaper")
    now = database_clock(ctx.engine).earliest()
    q = (
        select(Job)
        .where(Job.status == rules.IN_PROGRESS, col(Job.lease_expires_at) < now)
        .with_for_update(skip_locked=True)
    )
    with session_scope(ctx.engine, write=True) as s:
        rows = list(s.exec(q).all())
        for job in rows:
            holder, expired = job.assignee_agent_id, job.lease_expires_at
            payload = {"previous_assignee": holder, "lease_expired_at": str(expired)}
            _move(s, job, rules.PUBLISHED, actor=reaper, event="lease_expired", payload=payload)
    return len(rows)


def release_jobs_of_agent(s: Session, *, agent_id: str, reason: str) -> int:
    """Give back every job an agent holds (it was retired), inside the caller's transaction."""
    q = select(Job).where(
        Job.assignee_agent_id == agent_id,
        col(Job.status).in_([rules.IN_PROGRESS, rules.BLOCKED]),
    )
    rows = list(s.exec(q.with_for_update()).all())
    for job in rows:
        _move(s, job, rules.PUBLISHED, actor=system_actor(), event="released", reason=reason)
    return len(rows)


# -- status changes, completion and what follows it ------------------------------------------


def set_status(
    ctx: Context,
    *,
    actor: Actor | Principal,
    job_id: str,
    status: str,
    reason: str | None = None,
    lease_seconds: float | None = None,
) -> JobRecord:
    """Move a job to `status` (block, unblock with in_progress, release with published,
    fail, cancel; claim and complete too), as the transition table allows this caller."""
    who, lease = as_actor(ctx, actor, scope="run"), _lease(ctx, lease_seconds)
    reason = rules.check_reason(reason)
    if status not in rules.STATUSES:
        raise InvalidRequest(
            f"unknown status '{quoted(status)}'", hint=f"one of {', '.join(rules.STATUSES)}"
        )
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        if status == rules.COMPLETED:
            _complete_locked(s, job, who, {"summary": reason or "", "data": {}, "artifacts": []})
        elif status == rules.IN_PROGRESS and job.status == rules.PUBLISHED:
            _claim_locked(s, job, who, lease)
        else:
            _check_lease(s, job, who)  # a late holder blocks, releases or fails nothing
            event = _STATUS_EVENTS.get(status, status)
            _move(s, job, status, actor=who, event=event, reason=reason, lease=lease)
            if status in (rules.FAILED, rules.CANCELLED):
                _fail_dependents(s, job)
        return job_record(s, job)


def complete(
    ctx: Context,
    *,
    actor: Actor | Principal,
    job_id: str,
    summary: str = "",
    data: dict[str, Any] | None = None,
    artifacts: list[dict[str, Any]] | None = None,
) -> JobRecord:
    """Finish a held job with a result; dependents waiting only on it publish, and routing
    rules whose condition holds publish follow-on jobs linked to it."""
    who = as_actor(ctx, actor, scope="run")
    if data is not None and not isinstance(data, dict):
        raise InvalidRequest("the result's data must be a JSON object", hint='e.g. {"ok": true}')
    result = {
        "summary": summary or "",
        "data": data or {},
        "artifacts": rules.check_artifacts(artifacts),
    }
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        _complete_locked(s, job, who, result)
        return job_record(s, job)


def _complete_locked(s: Session, job: Job, actor: Actor, result: dict[str, Any]) -> None:
    _check_holder(s, job, actor)
    job.result_json = rules.encode_json(result, what="result")
    payload = {"result_summary": result["summary"], "artifacts": len(result["artifacts"])}
    _move(s, job, rules.COMPLETED, actor=actor, event="completed", payload=payload)
    s.flush()
    _publish_dependents(s, job)
    _route(s, job, result, actor)


def _dependents(s: Session, job_id: str) -> list[str]:
    q = select(JobDependency.job_id).where(JobDependency.blocker_id == job_id)
    return sorted(s.exec(q).all())


def _publish_dependents(s: Session, blocker: Job) -> None:
    floom = system_actor("dependencies")
    for dep_id in _dependents(s, blocker.id):
        dep = _lock(s, dep_id)
        if dep is None or dep.status != rules.PENDING:
            continue
        # Counted only after the lock: a blocker that completed concurrently committed first.
        still_open = s.exec(
            select(func.count())
            .select_from(JobDependency)
            .join(Job, col(Job.id) == col(JobDependency.blocker_id))
            .where(JobDependency.job_id == dep_id, Job.status != rules.COMPLETED)
        ).one()
        if still_open == 0:
            payload = {"reason": "every blocker completed", "last_blocker": blocker.id}
            _move(s, dep, rules.PUBLISHED, actor=floom, event="published", payload=payload)


def _fail_dependents(s: Session, blocker: Job) -> None:
    floom = system_actor("dependencies")
    queue = [blocker]
    while queue:
        current = queue.pop(0)
        for dep_id in _dependents(s, current.id):
            dep = _lock(s, dep_id)
            if dep is None or dep.status != rules.PENDING:
                continue
            why = f"blocker {current.id} {current.status}: {current.reason or 'no reason given'}"
            payload = {"blocker": current.id}
            _move(s, dep, rules.FAILED, actor=floom, event="failed", reason=why, payload=payload)
            queue.append(dep)


def _route(s: Session, job: Job, result: dict[str, Any], actor: Actor) -> None:
    for i, rule in enumerate(routing_rules(job.routing_json)):
        role = s.get(Role, rule["role_id"])
        skipped = None
        if not rules.evaluate(rule.get("condition"), result):
            skipped = "condition not met"
        elif role is None or role.retired_at is not None:
            skipped = "its role was retired"
        if role is None or skipped:
            why = {"rule": i, "why": skipped or "its role is gone"}
            record(s, job, type="routing_skipped", actor=actor, before=job.status, payload=why)
            continue
        context = dict(rule.get("context") or {})
        context["previous_job"] = {"id": job.id, "summary": job.summary, "result": result}
        follow = Job(
            id=new_id("job"),
            summary=rule.get("summary") or f"follow-up: {job.summary}"[: rules.MAX_SUMMARY],
            context_json=rules.encode_json(context, what="follow-on context"),
            constraints_json=json.dumps(rule.get("constraints") or []),
            artifacts_json=json.dumps(result["artifacts"]),
            priority=rule.get("priority") or job.priority,
            priority_rank=rules.PRIORITY_RANK[rule.get("priority") or job.priority],
            target_role_id=role.id,
            status=rules.PUBLISHED,
            source_agent_id=job.source_agent_id,
            created_by_key=job.created_by_key,
            follow_on_of=job.id,
        )
        s.add(follow)
        s.flush()
        record(s, follow, type="created", actor=actor, payload={"follow_on_of": job.id, "rule": i})
        payload = {"rule": i, "follow_on": follow.id, "role": role.name}
        record(s, job, type="routed", actor=actor, before=job.status, payload=payload)
