"""REST routes for handoff jobs under /api/v1/handoffs; every rule lives in the services."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from floom.api.auth import CtxDep, ReadCaller, RunCaller
from floom.api.openapi import Cursor, Limit, authed
from floom.api.routing import JSONRoute
from floom.schemas import handoffs as handoff_models
from floom.schemas.common import Page
from floom.services.handoffs import agents, flow, review, rules
from floom.services.handoffs import jobs as handoffs
from floom.views import handoffs as views

router = APIRouter(prefix="/api/v1/handoffs", tags=["handoffs"], route_class=JSONRoute)


LEASE: JsonDict = {"exclusiveMinimum": 0, "maximum": flow.MAX_LEASE_SECONDS}


class JobUpdate(BaseModel):
    """At least one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {"required": ["context"], "properties": {"context": {"type": "object"}}},
                {"required": ["constraints"], "properties": {"constraints": {"type": "array"}}},
            ]
        },
    )
    context: dict[str, Any] | None = Field(None, description="the full new context")
    constraints: list[str] | None = Field(
        None, description="the full new list", json_schema_extra=handoff_models.CONSTRAINTS
    )


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    lease_seconds: float | None = Field(
        None, description="the server's default if left out", json_schema_extra=LEASE
    )


class ClaimNextRequest(LeaseRequest):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    role: str | None = Field(None, description="only this one of your roles")


class StatusRequest(LeaseRequest):
    status: str = Field(json_schema_extra=handoff_models.JOB_STATUS)
    reason: str | None = None


class CompleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    summary: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra=handoff_models.ARTIFACTS
    )


class RejectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    reason: str = Field(json_schema_extra=handoff_models.TEXT)
    role: str | None = Field(None, description="route the retry to another role")
    priority: str | None = Field(None, json_schema_extra=handoff_models.PRIORITY)


_ONE_STATUS = "(" + "|".join(rules.STATUSES) + ")"
STATUS_LIST = f"^{_ONE_STATUS}(,{_ONE_STATUS})*$"


@router.get("/transitions", response_model=handoff_models.TransitionTable, responses=authed())
def transitions(_: ReadCaller) -> handoff_models.TransitionTable:
    return handoff_models.TransitionTable.model_validate(flow.transitions_table())


@router.get("/me", response_model=handoff_models.WhoAmI, responses=authed())
def my_roles(ctx: CtxDep, caller: ReadCaller) -> handoff_models.WhoAmI:
    return handoff_models.WhoAmI.model_validate(agents.my_roles(ctx, actor=caller))


@router.get("/jobs", response_model=Page[handoff_models.JobPublic], responses=authed(400, 404, 422))
def list_jobs(
    ctx: CtxDep,
    caller: ReadCaller,
    status: str | None = Query(
        None,
        description="one status, or several comma-separated",
        json_schema_extra={"pattern": STATUS_LIST},
    ),
    role: str | None = None,
    assignee: str | None = Query(None, description='an agent id or label, or "me"'),
    source: str | None = Query(None, description='an agent id or label, or "me"'),
    my_roles: bool = False,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Page[handoff_models.JobPublic]:
    query = handoff_models.JobQuery(
        status=[s for s in status.split(",") if s] if status else None,
        role=role,
        assignee=assignee,
        source=source,
        my_roles=my_roles,
        cursor=cursor,
        limit=limit,
    )
    items, next_cursor = handoffs.list_jobs(ctx, actor=caller, **query.model_dump())
    return views.job_page(items, next_cursor, surface=caller.surface)


@router.post(
    "/jobs",
    status_code=201,
    response_model=handoff_models.JobPublic,
    responses={
        200: {
            "model": handoff_models.JobPublic,
            "description": "the earlier job of this idempotency key",
        },
        **authed(400, 404, 409, 422),
    },
)
def create_job(
    body: handoff_models.JobRequest, ctx: CtxDep, caller: RunCaller, response: Response
) -> handoff_models.JobPublic:
    job = handoffs.create_job(ctx, actor=caller, **body.model_dump())
    if job.replayed:
        response.status_code = 200
    return views.job_public(job, surface=caller.surface)


@router.post(
    "/claim-next",
    response_model=handoff_models.ClaimNextResult,
    responses=authed(400, 404, 409, 422),
)
def claim_next(
    body: ClaimNextRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.ClaimNextResult:
    job = flow.claim_next(ctx, actor=caller, role=body.role, lease_seconds=body.lease_seconds)
    return views.claim_next_result(job, surface=caller.surface)


@router.get("/jobs/{job_id}", response_model=handoff_models.JobPublic, responses=authed(404, 422))
def get_job(
    job_id: str, ctx: CtxDep, caller: ReadCaller, events: bool = False
) -> handoff_models.JobPublic:
    job = handoffs.get_job(ctx, actor=caller, job_id=job_id, events=events)
    return views.job_public(job, surface=caller.surface)


@router.get(
    "/jobs/{job_id}/events",
    response_model=Page[handoff_models.JobEventPublic],
    responses=authed(404),
)
def list_events(
    job_id: str, ctx: CtxDep, caller: ReadCaller
) -> Page[handoff_models.JobEventPublic]:
    items = handoffs.list_events(ctx, actor=caller, job_id=job_id)
    return Page[handoff_models.JobEventPublic](
        items=[views.event_public(e, surface=caller.surface) for e in items], next_cursor=None
    )


@router.patch(
    "/jobs/{job_id}", response_model=handoff_models.JobPublic, responses=authed(400, 404, 409, 422)
)
def update_job(
    job_id: str, body: JobUpdate, ctx: CtxDep, caller: RunCaller
) -> handoff_models.JobPublic:
    job = handoffs.update_job(
        ctx, actor=caller, job_id=job_id, context=body.context, constraints=body.constraints
    )
    return views.job_public(job, surface=caller.surface)


@router.post(
    "/jobs/{job_id}/claim",
    response_model=handoff_models.JobPublic,
    responses=authed(400, 404, 409, 422),
)
def claim(
    job_id: str, body: LeaseRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.JobPublic:
    job = flow.claim(ctx, actor=caller, job_id=job_id, lease_seconds=body.lease_seconds)
    return views.job_public(job, surface=caller.surface)


@router.post(
    "/jobs/{job_id}/heartbeat",
    response_model=handoff_models.LeaseState,
    responses=authed(400, 404, 409, 422),
)
def heartbeat(
    job_id: str, body: LeaseRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.LeaseState:
    state = flow.heartbeat(ctx, actor=caller, job_id=job_id, lease_seconds=body.lease_seconds)
    return handoff_models.LeaseState.model_validate(state)


@router.post(
    "/jobs/{job_id}/status",
    response_model=handoff_models.JobPublic,
    responses=authed(400, 404, 409, 422),
)
def set_status(
    job_id: str, body: StatusRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.JobPublic:
    job = flow.set_status(
        ctx,
        actor=caller,
        job_id=job_id,
        status=body.status,
        reason=body.reason,
        lease_seconds=body.lease_seconds,
    )
    return views.job_public(job, surface=caller.surface)


@router.post(
    "/jobs/{job_id}/complete",
    response_model=handoff_models.JobPublic,
    responses=authed(400, 404, 409, 422),
)
def complete(
    job_id: str, body: CompleteRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.JobPublic:
    job = flow.complete(
        ctx,
        actor=caller,
        job_id=job_id,
        summary=body.summary,
        data=body.data,
        artifacts=body.artifacts,
    )
    return views.job_public(job, surface=caller.surface)


@router.post(
    "/jobs/{job_id}/reject",
    status_code=201,
    response_model=handoff_models.JobPublic,
    responses=authed(400, 404, 409, 422),
)
def reject(
    job_id: str, body: RejectRequest, ctx: CtxDep, caller: RunCaller
) -> handoff_models.JobPublic:
    retry = review.reject(
        ctx,
        actor=caller,
        job_id=job_id,
        reason=body.reason,
        role=body.role,
        priority=body.priority,
    )
    return views.job_public(retry, surface=caller.surface)


@router.get(
    "/jobs/{job_id}/reopen-context",
    response_model=handoff_models.ReopenContext,
    responses=authed(404),
)
def reopen_context(job_id: str, ctx: CtxDep, caller: ReadCaller) -> handoff_models.ReopenContext:
    return handoff_models.ReopenContext.model_validate(
        review.reopen_context(ctx, actor=caller, job_id=job_id)
    )
