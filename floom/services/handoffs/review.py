"""Review of handoff work: rejecting a completed job into a linked retry, and the focused
context an agent needs to do that retry."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import Conflict, Forbidden
from floom.services.access.principal import Principal
from floom.services.handoffs import rules
from floom.services.handoffs.agents import Actor, as_actor, find_role
from floom.services.handoffs.flow import parties
from floom.services.handoffs.jobs import (
    JobRecord,
    job_record,
    load_visible,
    record,
)
from floom.store.db import session_scope
from floom.store.handoffs import Agent, Job
from floom.store.models import new_id, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context


def holds_follow_on(s: Session, who: Actor, job_id: str) -> bool:
    """Whether `who` holds a follow-on job of `job_id` (reviewing it)."""
    return (
        who.agent_id is not None
        and s.exec(
            select(Job.id).where(Job.follow_on_of == job_id, Job.assignee_agent_id == who.agent_id)
        ).first()
        is not None
    )


def may_reject(s: Session, who: Actor, job: Job) -> bool:
    """The job's publisher, an admin, or the agent reviewing it may reject its result."""
    return who.admin or rules.SOURCE in parties(who, job) or holds_follow_on(s, who, job.id)


def reject(
    ctx: Context,
    *,
    actor: Actor | Principal,
    job_id: str,
    reason: str,
    role: str | None = None,
    priority: str | None = None,
) -> JobRecord:
    """Reject a completed job: a retry job, linked to it, is published for its role (or
    `role`) carrying the reason, its artifacts and its result's, and the reviewer.

    The source agent, an admin, or the agent holding a follow-on job of it may reject.
    """
    who = as_actor(ctx, actor, scope="run")
    reason = rules.check_reason(reason, required=True) or ""
    with session_scope(ctx.engine, write=True) as s:
        job = load_visible(s, who, job_id, lock=True)
        if job.status != rules.COMPLETED:
            raise Conflict(
                f"job {job_id} is {job.status}; only completed work can be rejected",
                hint="fail or cancel unfinished work instead",
                details={"status": job.status},
            )
        if job.superseded_by:
            raise Conflict(
                f"job {job_id} was already rejected; its retry is {job.superseded_by}",
                hint="reject the retry once it completes",
            )
        if not may_reject(s, who, job):
            raise Forbidden(
                "only the job's publisher, the agent reviewing it (holding a follow-on job) "
                "or an admin may reject it",
                hint="ask one of them, or publish a new job",
            )
        result = jsonvalues.stored(job.result_json or "{}", expect=dict)
        carried = rules.job_artifacts(job.artifacts_json)
        uris = {a["uri"] for a in carried}
        carried += [
            a
            for a in rules.job_artifacts(json.dumps(result.get("artifacts", [])))
            if a["uri"] not in uris
        ]
        new_priority = rules.check_priority(priority or job.priority)
        retry = Job(
            id=new_id("job"),
            summary=job.summary,
            context_json=job.context_json,
            constraints_json=job.constraints_json,
            artifacts_json=json.dumps(carried),
            routing_json=job.routing_json,
            priority=new_priority,
            priority_rank=rules.PRIORITY_RANK[new_priority],
            target_role_id=find_role(s, role).id if role else job.target_role_id,
            status=rules.PUBLISHED,
            source_agent_id=job.source_agent_id,
            created_by_key=job.created_by_key,
            retry_of=job.id,
            attempt=job.attempt + 1,
            rejection_reason=reason.strip(),
            rejected_by=who.agent_id or who.key_id,
        )
        s.add(retry)
        job.superseded_by = retry.id
        job.updated_at = utcnow()
        s.add(job)
        s.flush()
        payload = {"reason": reason.strip(), "retry_job": retry.id}
        record(s, job, type="rejected", actor=who, before=job.status, payload=payload)
        created = {"retry_of": job.id, "reason": reason.strip(), "attempt": retry.attempt}
        record(s, retry, type="created", actor=who, payload=created)
        return job_record(s, retry)


def reopen_context(ctx: Context, *, actor: Actor | Principal, job_id: str) -> dict[str, Any]:
    """The focused context for retrying a job: the original summary, the constraints, every
    rejection reason so far and the attempt count, without the full context payload."""
    who = as_actor(ctx, actor)
    with session_scope(ctx.engine) as s:
        job = load_visible(s, who, job_id)
        chain = [job]
        while chain[-1].retry_of and len(chain) < 1000:
            earlier = s.get(Job, chain[-1].retry_of)
            if earlier is None:
                break
            chain.append(earlier)
        chain.reverse()
        retries = chain[1:]
        if job.superseded_by:
            later = s.get(Job, job.superseded_by)
            retries += [later] if later else []
        reviewers = {j.rejected_by for j in retries if j.rejected_by}
        labels = {
            a.id: a.label for a in s.exec(select(Agent).where(col(Agent.id).in_(reviewers))).all()
        }
        return {
            "job_id": job.id,
            "original_job_id": chain[0].id,
            "status": job.status,
            "summary": chain[0].summary,
            "constraints": jsonvalues.stored_list(job.constraints_json, items=str),
            "attempt": job.attempt,
            "rejections": [
                {
                    "attempt": r.attempt - 1,
                    "rejected_job": r.retry_of,
                    "retry_job": r.id,
                    "reason": r.rejection_reason,
                    "reviewer": labels.get(r.rejected_by or "", r.rejected_by),
                    "rejected_at": r.created_at,
                }
                for r in retries
            ],
        }
