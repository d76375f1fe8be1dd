"""What the web UI's handoff board reads: a role's jobs by status, and one job with its
lineage and the moves the viewer may offer. Reads only; every move goes through
flow and review, which decide again when it is made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from floom.services.access.principal import SYSTEM, Principal
from floom.services.handoffs import review as handoff_review
from floom.services.handoffs import rules
from floom.services.handoffs.agents import Actor, as_actor, list_roles
from floom.services.handoffs.flow import parties
from floom.services.handoffs.jobs import get_job, list_jobs, load_visible, visible_clause
from floom.store.db import session_scope
from floom.store.handoffs import Job, JobDependency

if TYPE_CHECKING:
    from floom.services.context import Context

BOARD_LIMIT = 300
# The order the columns read in, left to right: waiting, open, being worked, then finished.
COLUMNS = rules.STATUSES
# Words for the buttons that make a move, by (from status, to status) or by to status.
MOVE_LABELS = {
    (rules.PUBLISHED, rules.IN_PROGRESS): "Claim",
    (rules.BLOCKED, rules.IN_PROGRESS): "Unblock",
    rules.BLOCKED: "Block",
    rules.PUBLISHED: "Release",
    rules.COMPLETED: "Complete",
    rules.FAILED: "Fail",
    rules.CANCELLED: "Cancel",
}


def board(
    ctx: Context, *, actor: Actor | Principal, role: str | None = None, limit: int = BOARD_LIMIT
) -> dict[str, Any]:
    """The newest `limit` jobs the viewer may see (of one role, if given), by status.

    Open columns list jobs in claim order (most urgent, then oldest); finished ones, the
    latest change first."""
    who = as_actor(ctx, actor)
    reader = actor if isinstance(actor, Principal) else SYSTEM  # an Actor is floom's own
    items, next_cursor = list_jobs(ctx, actor=who, role=role or None, limit=limit)
    columns = []
    for status in COLUMNS:
        jobs = [j for j in items if j.row.status == status]
        if status in rules.TERMINAL or status in (rules.IN_PROGRESS, rules.BLOCKED):
            jobs.sort(key=lambda j: j.row.updated_at, reverse=True)
        else:
            jobs.sort(key=lambda j: (-rules.PRIORITY_RANK[j.row.priority], j.row.id))
        columns.append({"status": status, "jobs": jobs})
    return {
        "columns": columns,
        "total": len(items),
        "more": next_cursor is not None,
        "roles": [r.name for r in list_roles(ctx, include_retired=True, caller=reader)],
        "viewer": who,
    }


def job_view(ctx: Context, *, actor: Actor | Principal, job_id: str) -> dict[str, Any]:
    """One job with its audit trail, the jobs around it that the viewer may see (blockers,
    dependents, follow-ons), and the moves the transition table offers the viewer."""
    who = as_actor(ctx, actor)
    job = get_job(ctx, actor=who, job_id=job_id, events=True)
    with session_scope(ctx.engine) as s:
        row = load_visible(s, who, job_id)
        held_by = parties(who, row)
        dependents = select(JobDependency.job_id).where(JobDependency.blocker_id == job_id)
        clause = visible_clause(who)

        def visible(q: Any) -> list[dict[str, Any]]:
            if clause is not None:
                q = q.where(clause)
            return [_brief(j) for j in s.exec(q.order_by(col(Job.id))).all()]

        related = {
            "blockers": visible(select(Job).where(col(Job.id).in_(job.blocked_by))),
            "dependents": visible(select(Job).where(col(Job.id).in_(dependents))),
            "follow_ons": visible(select(Job).where(Job.follow_on_of == job_id)),
        }
        may_reject = (
            row.status == rules.COMPLETED
            and not row.superseded_by
            and handoff_review.may_reject(s, who, row)
        )
    moves = []
    for to in rules.allowed_targets(row.status, parties=held_by, admin=who.admin):
        if to == rules.IN_PROGRESS and row.status == rules.PUBLISHED and who.agent_id is None:
            continue  # only an agent can hold a job, admin or not
        label = MOVE_LABELS.get((row.status, to)) or MOVE_LABELS.get(to, to)
        moves.append({"to": to, "label": label})
    return {
        "job": job,
        **related,
        "moves": moves,
        "may_reject": may_reject,
        "parties": sorted(held_by),
        "viewer": who,
    }


def _brief(job: Job) -> dict[str, Any]:
    return {"id": job.id, "summary": job.summary, "status": job.status, "attempt": job.attempt}
