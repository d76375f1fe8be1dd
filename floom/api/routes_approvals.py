"""REST routes for approvals, and for an agent run's transcript and tool calls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from floom.api.auth import CtxDep, ReadKey, RunKey
from floom.errors import NotFound
from floom.services import agent_runs, approvals, runs

router = APIRouter(prefix="/api/v1", tags=["approvals"])


class ApproveRequest(BaseModel):
    edited: dict[str, Any] | None = Field(
        None, description="values replacing the proposed ones, key by key"
    )
    comment: str | None = None


class RejectRequest(BaseModel):
    comment: str = Field(description="why: the agent or the worker's owner reads it")


@router.get("/approvals")
def list_approvals(
    ctx: CtxDep,
    _: ReadKey,
    status: str = Query("pending", description="pending, approved, rejected, cancelled or all"),
    run_id: str | None = None,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    rows, next_cursor = approvals.list_approvals(
        ctx, status=status, run_id=run_id, cursor=cursor, limit=limit
    )
    return {"items": [approvals.approval_to_dict(a) for a in rows], "next_cursor": next_cursor}


@router.get("/approvals/{approval_id}")
def get_approval(approval_id: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    return approvals.approval_to_dict(approvals.get_approval(ctx, approval_id=approval_id))


def _decided(ctx: CtxDep, approval_id: str) -> dict[str, Any]:
    body = approvals.approval_to_dict(approvals.get_approval(ctx, approval_id=approval_id))
    body["run_status"] = runs.get_run(ctx, run_id=body["run_id"]).status
    return body


@router.post("/approvals/{approval_id}/approve")
def approve(
    approval_id: str, ctx: CtxDep, key: RunKey, body: ApproveRequest | None = None
) -> dict[str, Any]:
    approvals.decide_approval(
        ctx,
        approval_id=approval_id,
        decision="approve",
        edited=body.edited if body else None,
        comment=body.comment if body else None,
        actor=key.id,
    )
    return _decided(ctx, approval_id)


@router.post("/approvals/{approval_id}/reject")
def reject(approval_id: str, body: RejectRequest, ctx: CtxDep, key: RunKey) -> dict[str, Any]:
    approvals.decide_approval(
        ctx, approval_id=approval_id, decision="reject", comment=body.comment, actor=key.id
    )
    return _decided(ctx, approval_id)


@router.get("/runs/{run_id}/tool-calls")
def list_tool_calls(run_id: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    runs.get_run(ctx, run_id=run_id)
    rows = agent_runs.list_tool_calls(ctx, run_id=run_id)
    return {"items": [agent_runs.tool_call_to_dict(c) for c in rows], "next_cursor": None}


@router.get("/runs/{run_id}/transcript")
def get_transcript(run_id: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    run = runs.get_run(ctx, run_id=run_id)
    transcript = agent_runs.load_transcript(ctx, run_id=run_id)
    if transcript is None:
        raise NotFound(
            f"run {run_id} has no transcript",
            hint=f"only agent (SKILL.md) runs have one; {run.worker_name} may be a script",
        )
    return agent_runs.transcript_to_dict(transcript)
