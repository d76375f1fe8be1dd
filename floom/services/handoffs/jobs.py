"""Handoff jobs: publishing, reading (with visibility), editing, and the audit trail.

Claims and status changes live in handoffs/flow.py; the rules without a database in
handoffs/rules.py. Every write records its audit event in the same transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, false, or_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import Conflict, Forbidden, InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.services import paging
from floom.services.access.principal import Principal
from floom.services.handoffs import rules
from floom.services.handoffs.agents import Actor, as_actor, find_agent, find_role
from floom.store.db import session_scope
from floom.store.handoffs import Agent, Job, JobDependency, JobEvent, Role
from floom.store.models import new_id, utcnow
from floom.vocabulary import JobPriority, JobStatus

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_BLOCKERS = 50


def record(
    s: Session,
    job: Job,
    *,
    type: str,
    actor: Actor,
    before: JobStatus | None = None,
    payload: dict[str, Any] | None = None,
) -> None:
    """Write one audit event for `job` (its status now is the event's new status)."""
    s.add(
        JobEvent(
            job_id=job.id,
            type=type,
            from_status=before,
            to_status=job.status,
            actor_agent_id=actor.agent_id,
            actor_key_id=actor.key_id,
            actor=actor.describe()[:160],
            payload_json=jsonvalues.dumps(payload or {}, where="payload"),
        )
    )


# -- reading ---------------------------------------------------------------------------------


def visible_clause(actor: Actor) -> ColumnElement[bool] | None:
    """SQL condition for the jobs an actor may see; None means every job (admins, floom)."""
    if actor.admin or actor.system:
        return None
    if actor.agent_id is None:
        return false()
    reviewed = aliased(Job)
    held_follow_ons = select(reviewed.follow_on_of).where(
        reviewed.assignee_agent_id == actor.agent_id, col(reviewed.follow_on_of).is_not(None)
    )
    return or_(
        col(Job.target_role_id).in_(actor.role_ids),
        col(Job.source_agent_id) == actor.agent_id,
        col(Job.assignee_agent_id) == actor.agent_id,
        # A reviewer holding a follow-on job may read the job it reviews.
        col(Job.id).in_(held_follow_ons),
    )


def load_visible(s: Session, actor: Actor, job_id: str, *, lock: bool = False) -> Job:
    """The job, or NotFound when it does not exist or the actor may not see it."""
    q = select(Job).where(Job.id == job_id)
    clause = visible_clause(actor)
    if clause is not None:
        q = q.where(clause)
    if lock:
        q = q.with_for_update()
    job = s.exec(q).first()
    if job is None:
        raise NotFound(
            f"no handoff job {quoted(job_id)} that you can see",
            hint=told(act("handoffs list"), " shows the jobs for your roles and the ones you hold"),
        )
    return job


@dataclass(frozen=True)
class JobRecord:
    """A job row with what its answer names beside it: its role's name, its blockers, its
    routing rules (each with its role's name), and the labels of the agents it mentions
    (schemas.handoffs.JobPublic.of). `replayed` when an idempotency key returned it; `events`
    (its audit trail, oldest first) when asked for."""

    row: Job
    role: str
    blocked_by: list[str]
    routing: list[dict[str, Any]]
    labels: dict[str, str]
    replayed: bool = False
    events: list[JobEvent] = field(default_factory=list)


def job_records(s: Session, jobs: list[Job]) -> list[JobRecord]:
    """The jobs with their blockers, role names and agent labels, in a few queries."""
    ids = [j.id for j in jobs]
    blockers: dict[str, list[str]] = {i: [] for i in ids}
    if ids:
        for dep in s.exec(
            select(JobDependency)
            .where(col(JobDependency.job_id).in_(ids))
            .order_by(col(JobDependency.blocker_id))
        ).all():
            blockers[dep.job_id].append(dep.blocker_id)
    routing = {j.id: routing_rules(j.routing_json) for j in jobs}
    role_ids = {j.target_role_id for j in jobs} | {
        r["role_id"] for rs in routing.values() for r in rs
    }
    roles = {r.id: r.name for r in s.exec(select(Role).where(col(Role.id).in_(role_ids))).all()}
    agent_ids = {
        a for j in jobs for a in (j.source_agent_id, j.assignee_agent_id, j.rejected_by) if a
    }
    labels = {
        a.id: a.label for a in s.exec(select(Agent).where(col(Agent.id).in_(agent_ids))).all()
    }
    for rs in routing.values():
        for r in rs:
            r["role"] = roles.get(r["role_id"], r["role_id"])
    return [
        JobRecord(
            row=j,
            role=roles.get(j.target_role_id, j.target_role_id),
            blocked_by=blockers[j.id],
            routing=routing[j.id],
            labels=labels,
        )
        for j in jobs
    ]


def job_record(s: Session, job: Job) -> JobRecord:
    return job_records(s, [job])[0]


def routing_rules(text: str) -> list[dict[str, Any]]:
    """A job's stored routing rules; an item that is not a rule (a row floom did not write)
    is left out rather than breaking every list of jobs."""
    rules = jsonvalues.stored(text, expect=list)
    return [r for r in rules if isinstance(r, dict) and isinstance(r.get("role_id"), str)]


def get_job(
    ctx: Context, *, actor: Actor | Principal, job_id: str, events: bool = False
) -> JobRecord:
    """One job the caller may see; with `events`, its audit trail, oldest first."""
    who = as_actor(ctx, actor)
    with session_scope(ctx.engine) as s:
        job = load_visible(s, who, job_id)
        found = job_record(s, job)
        if events:
            found = replace(found, events=_events(s, job_id))
        return found


def _events(s: Session, job_id: str) -> list[JobEvent]:
    q = select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
    return list(s.exec(q).all())


def list_events(ctx: Context, *, actor: Actor | Principal, job_id: str) -> list[JobEvent]:
    who = as_actor(ctx, actor)
    with session_scope(ctx.engine) as s:
        load_visible(s, who, job_id)
        return _events(s, job_id)


def list_jobs(
    ctx: Context,
    *,
    actor: Actor | Principal,
    status: list[str] | str | None = None,
    role: str | None = None,
    assignee: str | None = None,
    source: str | None = None,
    my_roles: bool = False,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[JobRecord], str | None]:
    """Jobs the caller may see, newest first; `assignee`/`source` take an agent or "me";
    `my_roles` keeps the jobs for roles the caller holds. `cursor` is the last id seen."""
    who = as_actor(ctx, actor)
    statuses = [status] if isinstance(status, str) else list(status or [])
    for st in statuses:
        if st not in rules.STATUSES:
            raise InvalidRequest(
                f"unknown status '{quoted(st)}'", hint=f"one of {', '.join(rules.STATUSES)}"
            )
    paging.check_limit(limit)
    q = select(Job).order_by(col(Job.id).desc()).limit(limit + 1)
    clause = visible_clause(who)
    if clause is not None:
        q = q.where(clause)
    if statuses:
        q = q.where(col(Job.status).in_(statuses))
    if my_roles:
        q = q.where(col(Job.target_role_id).in_(who.role_ids))
    if cursor := paging.id_cursor(cursor, prefix="job"):
        q = q.where(col(Job.id) < cursor)
    with session_scope(ctx.engine) as s:
        if role:
            q = q.where(Job.target_role_id == _filter_ref(s, who, "role", role))
        for column, field, ref in (
            (Job.assignee_agent_id, "assignee", assignee),
            (Job.source_agent_id, "source", source),
        ):
            if ref:
                q = q.where(column == _filter_ref(s, who, field, ref))
        rows = list(s.exec(q).all())
        more = len(rows) > limit
        rows = rows[:limit]
        return job_records(s, rows), rows[-1].id if more else None


def _filter_ref(s: Session, actor: Actor, field: str, ref: str) -> str:
    """The id a list filter names (a role, retired too, for `role`; an agent or "me"
    otherwise). A filter naming nothing is refused as a bad request naming the filter, as a
    misspelt status is, not answered 404: the list is there, the filter is wrong; an empty
    page would read as "no such jobs"."""
    if field != "role" and ref == "me":
        if actor.agent_id is None:
            raise InvalidRequest(
                f"{field}=me names the caller's agent, and this key belongs to no agent",
                hint=f"use an agent's key, or name the agent in {field} (label or id)",
                details={"field": field},
            )
        return actor.agent_id
    try:
        return find_role(s, ref, active=False).id if field == "role" else find_agent(s, ref).id
    except NotFound as exc:
        kind = "role" if field == "role" else "agent"
        raise InvalidRequest(
            f"the {field} filter names no {kind}: there is no {kind} '{quoted(ref)}'",
            hint=exc.advice,
            details={"field": field},
        ) from exc


# -- publishing and editing ------------------------------------------------------------------


def create_job(
    ctx: Context,
    *,
    actor: Actor | Principal,
    summary: str,
    role: str,
    context: dict[str, Any] | None = None,
    constraints: list[str] | None = None,
    artifacts: list[dict[str, Any]] | None = None,
    priority: str = "normal",
    blocked_by: list[str] | None = None,
    routing: list[dict[str, Any]] | None = None,
    idempotency_key: str | None = None,
) -> JobRecord:
    """Publish a job for `role`; with blockers it waits as `pending` until they complete.

    The same `idempotency_key` from the same agent returns the first job ("replayed": true)
    and creates nothing. A blocker that failed or was cancelled is refused.
    """
    who = as_actor(ctx, actor, scope="run")
    if who.agent_id is None and not who.admin:
        raise Forbidden("only agents and admins publish jobs", hint="use an agent's key")
    job = Job(
        id=new_id("job"),
        summary=rules.check_summary(summary),
        context_json=rules.encode_json(rules.check_context(context), what="context"),
        constraints_json=json.dumps(rules.check_constraints(constraints)),
        artifacts_json=json.dumps(rules.check_artifacts(artifacts)),
        priority=rules.check_priority(priority),
        priority_rank=rules.PRIORITY_RANK[JobPriority(priority)],
        target_role_id="",
        status=rules.PUBLISHED,
        source_agent_id=who.agent_id,
        created_by_key=who.key_id,
    )
    checked_routing = rules.check_routing(routing)
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 200:
            raise InvalidRequest(
                "an idempotency key is 1 to 200 characters", hint="e.g. a ticket id"
            )
        job.idempotency_scope = who.agent_id or f"key:{who.key_id}"
        job.idempotency_key = idempotency_key
        earlier = _replay(ctx, job)
        if earlier is not None:
            return earlier
    blocker_ids = sorted(set(blocked_by or []))
    if len(blocker_ids) > MAX_BLOCKERS:
        raise InvalidRequest(f"at most {MAX_BLOCKERS} blockers", hint="chain jobs instead")
    try:
        with session_scope(ctx.engine, write=True) as s:
            job.target_role_id = find_role(s, role).id
            for rule in checked_routing:
                # By id, so routing follows a renamed role.
                rule["role_id"] = find_role(s, rule.pop("role")).id
            job.routing_json = json.dumps(checked_routing)
            waiting = _lock_blockers(s, who, blocker_ids)
            job.status = rules.PENDING if waiting else rules.PUBLISHED
            s.add(job)
            for blocker_id in blocker_ids:
                s.add(JobDependency(job_id=job.id, blocker_id=blocker_id))
            s.flush()
            payload = {"role": role, "priority": job.priority, "blocked_by": blocker_ids}
            if waiting:
                payload["waiting_on"] = waiting
            record(s, job, type="created", actor=who, payload=payload)
            return job_record(s, job)
    except IntegrityError:
        # Two creates with one idempotency key raced; the other one won.
        earlier = _replay(ctx, job) if job.idempotency_key else None
        if earlier is None:
            raise
        return earlier


def _replay(ctx: Context, job: Job) -> JobRecord | None:
    with session_scope(ctx.engine) as s:
        first = s.exec(
            select(Job).where(
                Job.idempotency_scope == job.idempotency_scope,
                Job.idempotency_key == job.idempotency_key,
            )
        ).first()
        return None if first is None else replace(job_record(s, first), replayed=True)


def _lock_blockers(s: Session, actor: Actor, blocker_ids: list[str]) -> list[str]:
    """Lock the blockers (in id order, so concurrent publishers cannot deadlock) and return
    the ones not completed yet. Locking makes a blocker completing at this moment either
    finish first (and count as completed here) or see this new dependent."""
    waiting = []
    for blocker_id in blocker_ids:
        blocker = load_visible(s, actor, blocker_id, lock=True)
        if blocker.status in (rules.FAILED, rules.CANCELLED):
            raise Conflict(
                f"blocker {blocker_id} is {blocker.status}; a job cannot wait on it",
                hint="leave it out of blocked_by, or publish its retry first",
            )
        if blocker.status != rules.COMPLETED:
            waiting.append(blocker_id)
    return waiting


def update_job(
    ctx: Context,
    *,
    actor: Actor | Principal,
    job_id: str,
    context: dict[str, Any] | None = None,
    constraints: list[str] | None = None,
) -> JobRecord:
    """Replace a job's context and/or constraints: only its source agent or an admin, and
    only before it completes. The event keeps the old and the new values."""
    who = as_actor(ctx, actor, scope="run")
    if context is None and constraints is None:
        raise InvalidRequest("nothing to update", hint="give a new context and/or constraints")
    new_context = rules.check_context(context) if context is not None else None
    new_constraints = rules.check_constraints(constraints) if constraints is not None else None
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        is_source = who.agent_id is not None and who.agent_id == job.source_agent_id
        if not (is_source or who.admin or (who.key_id and who.key_id == job.created_by_key)):
            raise Forbidden(
                "only the agent that published a job (or an admin) may change it",
                hint="ask its publisher, or publish a new job",
            )
        if job.status in rules.TERMINAL:
            raise Conflict(
                f"job {job_id} is {job.status}; its context and constraints are final",
                hint="reject it (if completed) to get a retry, or publish a new job",
            )
        changes: dict[str, Any] = {}
        if new_context is not None:
            changes["context"] = {"old": jsonvalues.stored(job.context_json), "new": new_context}
            job.context_json = rules.encode_json(new_context, what="context")
        if new_constraints is not None:
            old = jsonvalues.stored(job.constraints_json)
            changes["constraints"] = {"old": old, "new": new_constraints}
            job.constraints_json = json.dumps(new_constraints)
        job.updated_at = utcnow()
        s.add(job)
        record(s, job, type="updated", actor=who, before=job.status, payload=changes)
        return job_record(s, job)
