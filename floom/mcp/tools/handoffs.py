"""floom's handoff tools over MCP: agents publish, claim, finish and review jobs by role.

Written once against the Backend interface, like the other tools; the caller acts as its
key's agent, and its roles are read on every call, so a role granted or retired mid-session
counts on the next call. Role names are plain strings in the schemas for the same reason.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from floom.cut import cut
from floom.mcp.render import MAX_TEXT_ITEMS, Reply, said, short
from floom.mcp.toolkit import (
    DESTRUCTIVE,
    READ,
    WRITE,
    FloomTool,
    backend_of,
    floom_tool,
    off,
)
from floom.schemas.common import OneOf
from floom.schemas.handoffs import JobPublic, JobQuery, JobRequest
from floom.vocabulary import JobPriority, JobStatus

JobId = Annotated[str, Field(description="handoff job id, e.g. job_0123abcd...")]
# The vocabulary's words (floom/vocabulary.py), refused outside the set as a Literal would be.
Status = Annotated[JobStatus, OneOf(JobStatus, strict=True)]
Priority = Annotated[JobPriority, OneOf(JobPriority, strict=True)]
LeaseSeconds = Annotated[
    float | None,
    Field(gt=0, le=86_400, description="how long the claim holds without a heartbeat"),
]
Artifacts = Annotated[
    list[dict[str, Any]] | None,
    Field(description='each {"type", "uri", "checksum"?, "metadata"?}, e.g. a PR or a log'),
]


# -- what a person (or a model) reads at a glance -------------------------------------------


def job_line(job: JobPublic) -> str:
    who = job.assignee.label if job.assignee else None
    held = f" held by {who}" if who else ""
    attempt = f" attempt {job.attempt}" if job.attempt > 1 else ""
    return (
        f"{job.id}  [{job.status}] {job.priority} for {job.role}"
        f"{said(held)}{attempt}: {said(cut(job.summary, 120))}"
    )


def job_text(job: JobPublic, head: str = "") -> str:
    lines = [head + job_line(job)] if head else [job_line(job)]
    if job.constraints:
        lines.append("constraints: " + "; ".join(said(c) for c in job.constraints))
    if job.context:
        lines.append(f"context: {short(job.context, 600)}")
    if job.blocked_by:
        lines.append("waits on: " + ", ".join(job.blocked_by))
    if job.lease_expires_at and job.status == JobStatus.IN_PROGRESS:
        lines.append(
            f"lease until {job.lease_expires_at.isoformat()}; handoff_heartbeat extends it, "
            "handoff_complete_job finishes it"
        )
    if job.rejection:
        lines.append(
            f"retry of {job.retry_of} (attempt {job.attempt}), rejected: "
            f"{said(job.rejection.reason)}; handoff_reopen_context tells every rejection"
        )
    if job.follow_on_of:
        lines.append(f"follow-on of {job.follow_on_of}")
    if job.superseded_by:
        lines.append(f"rejected; retry {job.superseded_by}")
    if job.result:
        lines.append(f"result: {short(job.result, 600)}")
    if job.reason:
        lines.append(f"reason: {said(job.reason)}")
    for event in job.events:
        moved = (
            f" {event.from_status or '-'} -> {event.to_status}"
            if event.from_status != event.to_status
            else ""
        )
        why = event.payload.get("reason")
        lines.append(
            f"  {event.ts.isoformat()} {event.type}{moved} by {said(event.actor)}"
            + (f": {said(str(why))}" if why else "")
        )
    return "\n".join(lines)


def jobs_text(items: list[JobPublic], next_cursor: str | None) -> str:
    if not items:
        return "no handoff jobs that you can see match"
    lines = [f"{len(items)} job(s), newest first:"]
    lines += [f"  {job_line(j)}" for j in items[:MAX_TEXT_ITEMS]]
    if len(items) > MAX_TEXT_ITEMS:
        lines.append(f"  ... and {len(items) - MAX_TEXT_ITEMS} more")
    if next_cursor:
        lines.append(f"(next page: cursor={next_cursor})")
    return "\n".join(lines)


# -- the tools -------------------------------------------------------------------------------


@floom_tool
async def handoff_my_roles(ctx: Context) -> Reply:
    """Who you are in handoffs: your agent, whether your key is an admin's, and the roles you
    hold right now (jobs for these roles are yours to claim)."""
    me = await off(backend_of(ctx).handoff_my_roles)
    agent = me.agent
    roles = ", ".join(me.roles) or "none"
    who = f"agent {agent.label}" if agent else "an admin key without an agent"
    text = f"you are {who}{' (admin)' if me.admin and agent else ''}; roles: {roles}"
    return Reply(text, me.to_json())


@floom_tool
async def handoff_create_job(
    ctx: Context,
    summary: Annotated[str, Field(description="one line saying what is to be done")],
    role: Annotated[str, Field(description="the role that should do it, e.g. reviewer")],
    context: Annotated[
        dict[str, Any] | None, Field(description="everything the taker needs, as JSON")
    ] = None,
    constraints: Annotated[
        list[str] | None, Field(description='rules the work must keep, e.g. "no new deps"')
    ] = None,
    artifacts: Artifacts = None,
    priority: Priority = JobPriority.NORMAL,
    blocked_by: Annotated[
        list[str] | None, Field(description="job ids that must complete first")
    ] = None,
    routing: Annotated[
        list[dict[str, Any]] | None,
        Field(
            description="follow-on jobs published on completion: {role, summary?, priority?, "
            'context?, constraints?, condition?}; e.g. condition {"path": "data.verdict", '
            '"equals": "approve"}'
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None, Field(description="the same key again returns the first job")
    ] = None,
) -> Reply:
    """Publish a job for a role; agents holding that role claim it. With blocked_by it waits
    (pending) until those jobs complete."""
    spec = JobRequest(
        summary=summary,
        role=role,
        context=context or {},
        constraints=constraints or [],
        artifacts=artifacts or [],
        priority=priority,
        blocked_by=blocked_by or [],
        routing=routing or [],
        idempotency_key=idempotency_key,
    )
    job = await off(backend_of(ctx).handoff_create_job, spec)
    head = "already published (same idempotency key): " if job.replayed else "published "
    return Reply(job_text(job, head), job.to_json())


@floom_tool
async def handoff_list_jobs(
    ctx: Context,
    status: Annotated[list[Status] | None, Field(description="only jobs in these statuses")] = None,
    role: Annotated[str | None, Field(description="only jobs for this role")] = None,
    assignee: Annotated[
        str | None, Field(description='only jobs held by this agent (label or id), or "me"')
    ] = None,
    source: Annotated[
        str | None, Field(description='only jobs published by this agent, or "me"')
    ] = None,
    my_roles: Annotated[bool, Field(description="only jobs for roles you hold")] = False,
    cursor: Annotated[str | None, Field(description="next_cursor of a previous page")] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 50,
) -> Reply:
    """Handoff jobs you can see (your roles', the ones you published or hold), newest first,
    with their lineage (retry_of, superseded_by, follow_on_of)."""
    query = JobQuery(
        status=list(status) if status else None,
        role=role,
        assignee=assignee,
        source=source,
        my_roles=my_roles,
        cursor=cursor,
        limit=limit,
    )
    page = await off(backend_of(ctx).handoff_list_jobs, query)
    return Reply(jobs_text(page.items, page.next_cursor), page.to_json())


@floom_tool
async def handoff_get_job(
    ctx: Context,
    job_id: JobId,
    events: Annotated[bool, Field(description="include the audit trail")] = True,
) -> Reply:
    """One job: context, constraints, artifacts, result, dependencies, lineage and its audit
    trail (who moved it from which status to which, when)."""
    job = await off(backend_of(ctx).handoff_get_job, job_id, events=events)
    return Reply(job_text(job), job.to_json())


@floom_tool
async def handoff_claim_job(
    ctx: Context, job_id: JobId, lease_seconds: LeaseSeconds = None
) -> Reply:
    """Claim one published job of a role you hold; you hold it until the lease runs out."""
    job = await off(backend_of(ctx).handoff_claim_job, job_id, lease_seconds=lease_seconds)
    return Reply(job_text(job, "claimed "), job.to_json())


@floom_tool
async def handoff_claim_next_job(
    ctx: Context,
    role: Annotated[str | None, Field(description="only this one of your roles")] = None,
    lease_seconds: LeaseSeconds = None,
) -> Reply:
    """Claim the most urgent, then oldest, published job of your roles. Jobs other agents
    hold are skipped; "job" is null when nothing waits."""
    body = await off(backend_of(ctx).handoff_claim_next_job, role=role, lease_seconds=lease_seconds)
    job = body.job
    if job is None:
        return Reply("no published job waits for your roles; try again later", body.to_json())
    return Reply(job_text(job, "claimed "), body.to_json())


@floom_tool
async def handoff_heartbeat(
    ctx: Context, job_id: JobId, lease_seconds: LeaseSeconds = None
) -> Reply:
    """Extend the lease on a job you hold, while you are still working on it."""
    body = await off(backend_of(ctx).handoff_heartbeat, job_id, lease_seconds=lease_seconds)
    until = body.lease_expires_at.isoformat() if body.lease_expires_at else None
    return Reply(f"job {job_id} is {body.status}; lease until {until}", body.to_json())


@floom_tool
async def handoff_set_status(
    ctx: Context,
    job_id: JobId,
    status: Annotated[
        Status,
        Field(
            description="blocked (block), in_progress (unblock a blocked job, or claim), "
            "published (give it back), failed, cancelled"
        ),
    ],
    reason: Annotated[str | None, Field(description="why; kept in the audit trail")] = None,
    lease_seconds: LeaseSeconds = None,
) -> Reply:
    """Move a job as the transition table allows you: block it, unblock it (in_progress),
    release it (published), fail or cancel it. A refused move lists the allowed ones."""
    job = await off(
        backend_of(ctx).handoff_set_status,
        job_id,
        status,
        reason=reason,
        lease_seconds=lease_seconds,
    )
    return Reply(job_text(job, "now "), job.to_json())


@floom_tool
async def handoff_update_job(
    ctx: Context,
    job_id: JobId,
    context: Annotated[dict[str, Any] | None, Field(description="the full new context")] = None,
    constraints: Annotated[list[str] | None, Field(description="the full new list")] = None,
) -> Reply:
    """Replace a job's context and/or constraints (its publisher or an admin, before it
    completes); the audit trail keeps the old and new values."""
    job = await off(
        backend_of(ctx).handoff_update_job, job_id, context=context, constraints=constraints
    )
    return Reply(job_text(job, "updated "), job.to_json())


@floom_tool
async def handoff_complete_job(
    ctx: Context,
    job_id: JobId,
    summary: Annotated[str, Field(description="what was done, in a line or two")],
    data: Annotated[
        dict[str, Any] | None, Field(description='structured result, e.g. {"pr": 91}')
    ] = None,
    artifacts: Artifacts = None,
) -> Reply:
    """Finish a job you hold with a result; follow-on jobs and waiting dependents publish."""
    job = await off(
        backend_of(ctx).handoff_complete_job,
        job_id,
        summary=summary,
        data=data,
        artifacts=artifacts,
    )
    return Reply(job_text(job, "completed "), job.to_json())


@floom_tool
async def handoff_reject_job(
    ctx: Context,
    job_id: JobId,
    reason: Annotated[str, Field(description="what must change; the retry carries it")],
    role: Annotated[str | None, Field(description="send the retry to another role")] = None,
    priority: Priority | None = None,
) -> Reply:
    """Reject completed work (its publisher, its reviewer or an admin): a retry job linked by
    retry_of is published with the reason, the artifacts and you as reviewer."""
    retry = await off(
        backend_of(ctx).handoff_reject_job, job_id, reason=reason, role=role, priority=priority
    )
    return Reply(job_text(retry, f"rejected {job_id}; retry "), retry.to_json())


@floom_tool
async def handoff_reopen_context(ctx: Context, job_id: JobId) -> Reply:
    """What you need to redo a rejected job: the original summary, the constraints, every
    rejection reason so far and the attempt count (without the full context payload)."""
    body = await off(backend_of(ctx).handoff_reopen_context, job_id)
    lines = [
        f"job {body.job_id} is attempt {body.attempt} of {body.original_job_id}: "
        + said(body.summary)
    ]
    if body.constraints:
        lines.append("constraints: " + "; ".join(said(c) for c in body.constraints))
    for r in body.rejections:
        lines.append(f"  attempt {r.attempt} rejected by {said(r.reviewer)}: {said(r.reason)}")
    return Reply("\n".join(lines), body.to_json())


# Each tool's hints and the scope a key needs for it (floom.mcp.toolkit.FloomTool).
HANDOFF_TOOLS: tuple[FloomTool, ...] = (
    FloomTool(handoff_my_roles, READ, "read"),
    FloomTool(handoff_list_jobs, READ, "read"),
    FloomTool(handoff_get_job, READ, "read"),
    FloomTool(handoff_create_job, WRITE, "run"),
    FloomTool(handoff_claim_job, WRITE, "run"),
    FloomTool(handoff_claim_next_job, WRITE, "run"),
    FloomTool(handoff_heartbeat, WRITE, "run"),
    FloomTool(handoff_set_status, DESTRUCTIVE, "run"),
    FloomTool(handoff_update_job, WRITE, "run"),
    FloomTool(handoff_complete_job, WRITE, "run"),
    FloomTool(handoff_reject_job, WRITE, "run"),
    FloomTool(handoff_reopen_context, READ, "read"),
)
