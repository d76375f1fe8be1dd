"""REST routes for handoff jobs under /api/v1/handoffs; every rule lives in the services."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from floom.api.auth import CtxDep, ReadKey, RunKey
from floom.services import handoff_agents as agents
from floom.services import handoff_flow as flow
from floom.services import handoff_review as review
from floom.services import handoffs

router = APIRouter(prefix="/api/v1/handoffs", tags=["handoffs"])


class JobRequest(BaseModel):
    summary: str
    role: str = Field(description="the target role's name")
    context: dict[str, Any] = Field(default_factory=dict)
    constraints: list[str] = Field(default_factory=list)
    artifacts: list[dict[str, Any]] = Field(
        default_factory=list, description="each {type, uri, checksum?, metadata?}"
    )
    priority: str = Field("normal", description="low, normal, high or urgent")
    blocked_by: list[str] = Field(default_factory=list, description="ids of jobs to wait for")
    routing: list[dict[str, Any]] = Field(
        default_factory=list,
        description="follow-on jobs on completion: {role, summary?, priority?, context?, "
        'constraints?, condition?}; a condition is e.g. {"path": "data.verdict", '
        '"equals": "approve"}',
    )
    idempotency_key: str | None = Field(None, description="the same key returns the first job")


class JobUpdate(BaseModel):
    context: dict[str, Any] | None = Field(None, description="the full new context")
    constraints: list[str] | None = Field(None, description="the full new list")


class LeaseRequest(BaseModel):
    lease_seconds: float | None = Field(None, description="the server's default if left out")


class ClaimNextRequest(LeaseRequest):
    role: str | None = Field(None, description="only this one of your roles")


class StatusRequest(LeaseRequest):
    status: str
    reason: str | None = None


class CompleteRequest(BaseModel):
    summary: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)


class RejectRequest(BaseModel):
    reason: str
    role: str | None = Field(None, description="route the retry to another role")
    priority: str | None = None


@router.get("/transitions")
def transitions(_: ReadKey) -> dict[str, Any]:
    return flow.transitions_table()


@router.get("/me")
def my_roles(ctx: CtxDep, key: ReadKey) -> dict[str, Any]:
    return agents.my_roles(ctx, actor=key)


@router.get("/jobs")
def list_jobs(
    ctx: CtxDep,
    key: ReadKey,
    status: str | None = Query(None, description="one status, or several comma-separated"),
    role: str | None = None,
    assignee: str | None = Query(None, description='an agent id or label, or "me"'),
    source: str | None = Query(None, description='an agent id or label, or "me"'),
    my_roles: bool = False,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    items, next_cursor = handoffs.list_jobs(
        ctx,
        actor=key,
        status=[s for s in status.split(",") if s] if status else None,
        role=role,
        assignee=assignee,
        source=source,
        my_roles=my_roles,
        cursor=cursor,
        limit=limit,
    )
    return {"items": items, "next_cursor": next_cursor}


@router.post("/jobs", status_code=201)
def create_job(body: JobRequest, ctx: CtxDep, key: RunKey, response: Response) -> dict[str, Any]:
    job = handoffs.create_job(ctx, actor=key, **body.model_dump())
    if job.get("replayed"):
        response.status_code = 200
    return job


@router.post("/claim-next")
def claim_next(body: ClaimNextRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    job = flow.claim_next(ctx, actor=key, role=body.role, lease_seconds=body.lease_seconds)
    return {"job": job}


@router.get("/jobs/{job_id}")
def get_job(job_id: str, ctx: CtxDep, key: ReadKey, events: bool = False) -> dict[str, Any]:
    return handoffs.get_job(ctx, actor=key, job_id=job_id, events=events)


@router.get("/jobs/{job_id}/events")
def list_events(job_id: str, ctx: CtxDep, key: ReadKey) -> dict[str, Any]:
    items = handoffs.list_events(ctx, actor=key, job_id=job_id)
    return {"items": items, "next_cursor": None}


@router.patch("/jobs/{job_id}")
def update_job(job_id: str, body: JobUpdate, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return handoffs.update_job(
        ctx, actor=key, job_id=job_id, context=body.context, constraints=body.constraints
    )


@router.post("/jobs/{job_id}/claim")
def claim(job_id: str, body: LeaseRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return flow.claim(ctx, actor=key, job_id=job_id, lease_seconds=body.lease_seconds)


@router.post("/jobs/{job_id}/heartbeat")
def heartbeat(job_id: str, body: LeaseRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return flow.heartbeat(ctx, actor=key, job_id=job_id, lease_seconds=body.lease_seconds)


@router.post("/jobs/{job_id}/status")
def set_status(job_id: str, body: StatusRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return flow.set_status(
        ctx,
        actor=key,
        job_id=job_id,
        status=body.status,
        reason=body.reason,
        lease_seconds=body.lease_seconds,
    )


@router.post("/jobs/{job_id}/complete")
def complete(job_id: str, body: CompleteRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return flow.complete(
        ctx,
        actor=key,
        job_id=job_id,
        summary=body.summary,
        data=body.data,
        artifacts=body.artifacts,
    )


@router.post("/jobs/{job_id}/reject", status_code=201)
def reject(job_id: str, body: RejectRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    return review.reject(
        ctx,
        actor=key,
        job_id=job_id,
        reason=body.reason,
        role=body.role,
        priority=body.priority,
    )


@router.get("/jobs/{job_id}/reopen-context")
def reopen_context(job_id: str, ctx: CtxDep, key: ReadKey) -> dict[str, Any]:
    return review.reopen_context(ctx, actor=key, job_id=job_id)
