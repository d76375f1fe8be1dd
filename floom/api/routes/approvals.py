"""REST routes for approvals, and for an agent run's transcript and tool calls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from floom.api.auth import CtxDep, ReadCaller, RunCaller
from floom.api.openapi import Cursor, Limit, authed
from floom.api.routing import JSONRoute
from floom.errors import NotFound
from floom.schemas import runs as run_models
from floom.schemas.common import Page
from floom.services.runs import approvals
from floom.services.runs import lifecycle as runs
from floom.views import runs as views

router = APIRouter(prefix="/api/v1", tags=["approvals"], route_class=JSONRoute)


class ApproveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    edited: dict[str, Any] | None = Field(
        None, description="values replacing the proposed ones, key by key"
    )
    comment: str | None = None


class RejectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    comment: str = Field(
        description="why: the agent or the worker's owner reads it",
        json_schema_extra={"minLength": 1},
    )


@router.get(
    "/approvals", response_model=Page[run_models.ApprovalPublic], responses=authed(400, 422)
)
def list_approvals(
    ctx: CtxDep,
    caller: ReadCaller,
    status: str = Query(
        approvals.PENDING,
        description="only approvals in this status, or all",
        json_schema_extra={"enum": [*approvals.APPROVAL_STATUSES, "all"]},
    ),
    run_id: str | None = Query(None, description="only this run's approvals"),
    worker: str | None = Query(None, description="only this worker's approvals"),
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Page[run_models.ApprovalPublic]:
    query = run_models.ApprovalQuery(
        status=status, run_id=run_id, worker=worker, cursor=cursor, limit=limit
    )
    rows, next_cursor = approvals.list_approvals(ctx, **query.model_dump(), caller=caller)
    return views.approval_page(rows, next_cursor)


@router.get(
    "/approvals/{approval_id}", response_model=run_models.ApprovalPublic, responses=authed(404)
)
def get_approval(approval_id: str, ctx: CtxDep, caller: ReadCaller) -> run_models.ApprovalPublic:
    return run_models.ApprovalPublic.of(
        approvals.get_approval(ctx, approval_id=approval_id, caller=caller)
    )


@router.post(
    "/approvals/{approval_id}/approve",
    response_model=run_models.ApprovalDecided,
    responses=authed(400, 404, 409, 422),
)
def approve(
    approval_id: str, ctx: CtxDep, caller: RunCaller, body: ApproveRequest | None = None
) -> run_models.ApprovalDecided:
    approvals.decide_approval(
        ctx,
        approval_id=approval_id,
        decision="approve",
        edited=body.edited if body else None,
        comment=body.comment if body else None,
        caller=caller,
    )
    return views.approval_decided(ctx, approval_id=approval_id, caller=caller)


@router.post(
    "/approvals/{approval_id}/reject",
    response_model=run_models.ApprovalDecided,
    responses=authed(400, 404, 409, 422),
)
def reject(
    approval_id: str, body: RejectRequest, ctx: CtxDep, caller: RunCaller
) -> run_models.ApprovalDecided:
    approvals.decide_approval(
        ctx, approval_id=approval_id, decision="reject", comment=body.comment, caller=caller
    )
    return views.approval_decided(ctx, approval_id=approval_id, caller=caller)


@router.get(
    "/runs/{run_id}/tool-calls",
    response_model=Page[run_models.ToolCallPublic],
    responses=authed(404),
)
def list_tool_calls(
    run_id: str, ctx: CtxDep, caller: ReadCaller
) -> Page[run_models.ToolCallPublic]:
    return views.tool_call_page(ctx, run_id=run_id, caller=caller)


@router.get(
    "/runs/{run_id}/transcript", response_model=run_models.TranscriptPublic, responses=authed(404)
)
def get_transcript(run_id: str, ctx: CtxDep, caller: ReadCaller) -> run_models.TranscriptPublic:
    run = runs.get_run(ctx, run_id=run_id, caller=caller)
    transcript = views.transcript_public(ctx, run_id=run_id, caller=caller)
    if transcript is None:
        raise NotFound(
            f"run {run_id} has no transcript",
            hint=f"only agent (SKILL.md) runs have one; {run.worker_name} may be a script",
        )
    return transcript
