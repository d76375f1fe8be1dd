"""Runs, their log events, artifacts, tool calls, approvals and transcripts, as answered."""

from __future__ import annotations

from typing import TypeVar

from floom.hints.surface import render, tell
from floom.schemas.common import Page
from floom.schemas.runs import (
    ApprovalDecided,
    ApprovalPublic,
    ArtifactPublic,
    LogPage,
    ModelUsage,
    RunDetail,
    RunError,
    RunEventPublic,
    RunPublic,
    ToolCallPublic,
    TranscriptPublic,
)
from floom.services.access.principal import Principal, Surface
from floom.services.context import Context
from floom.services.ops import nodes
from floom.services.runs import agent as agent_runs
from floom.services.runs import approvals, logs
from floom.services.runs import lifecycle as runs
from floom.services.runs import records as run_records
from floom.services.runs import rules as run_rules
from floom.services.runs.records import RunRecord
from floom.store.agents import Approval, ToolCall
from floom.store.models import Artifact, Run, RunEvent

R = TypeVar("R", bound=RunPublic)


def run_public(run: Run, *, surface: Surface, artifacts: list[Artifact] | None = None) -> RunPublic:
    return told(RunPublic.of(run, artifacts=artifacts), surface)


def started_run(ctx: Context, run: Run, *, surface: Surface) -> RunPublic:
    """A run just queued, as its starter is told: with why it cannot start, if no node can
    run it."""
    return _say_if_stuck(ctx, told(RunPublic.of(run, artifacts=[]), surface), surface)


def _say_if_stuck(ctx: Context, run: R, surface: Surface) -> R:
    queued = run.status == run_rules.QUEUED
    if queued and not ctx.node.executes_runs() and not nodes.live_executor_ids(ctx):
        run.cannot_start = render(nodes.RUN_CANNOT_START, surface=surface)
    return run


def run_page(rows: list[Run], next_cursor: str | None, *, surface: Surface) -> Page[RunPublic]:
    items = [run_public(r, surface=surface) for r in rows]
    return Page[RunPublic](items=items, next_cursor=next_cursor)


def run_detail(ctx: Context, *, run_id: str, caller: Principal) -> RunDetail:
    record = run_records.run_record(ctx, run_id=run_id, caller=caller)
    return run_detail_of(ctx, record, caller=caller)


def run_detail_of(ctx: Context, record: RunRecord, *, caller: Principal) -> RunDetail:
    """run_detail for a record the caller has in hand (the one that ended a wait, read with
    the run or written with its end)."""
    caller.require("read")
    run = record.run
    extras = run_records.run_extras(ctx, run=run, run_approvals=record.approvals, caller=caller)
    detail = RunDetail.of(
        run,
        artifacts=record.artifacts,
        tool_calls=[ToolCallPublic.of(c) for c in extras.tool_calls],
        approvals=[ApprovalPublic.of(a) for a in extras.approvals],
        model_usage=ModelUsage.of(extras.transcript) if extras.transcript else None,
    )
    return _say_if_stuck(ctx, told(detail, caller.surface), caller.surface)


def told(run: R, surface: Surface) -> R:
    """The run with its stored error's message told for `surface` (stored in the CLI's
    notation, it may name what to do: set a secret, then replay)."""
    if run.error is not None:
        run.error = RunError(code=run.error.code, message=tell(run.error.message, surface=surface))
    return run


def event_public(event: RunEvent, *, surface: Surface) -> RunEventPublic:
    body = RunEventPublic.of(event)
    if body.stream == "system":
        # floom's own notices name what to do next (decide an approval), stored in the CLI's
        # notation; what the script printed is its own and stays as printed.
        body.line = tell(body.line, surface=surface) or ""
    return body


def log_page(
    ctx: Context,
    *,
    run_id: str,
    after: int = 0,
    tail: int | None = None,
    limit: int = 1000,
    caller: Principal,
) -> LogPage:
    run = runs.get_run(ctx, run_id=run_id, caller=caller)
    if tail:
        rows = logs.tail_events(ctx, run_id=run_id, count=tail, caller=caller)
    else:
        rows = logs.list_events(ctx, run_id=run_id, after=after, limit=limit, caller=caller)
    return LogPage(
        items=[event_public(e, surface=caller.surface) for e in rows],
        last_seq=rows[-1].seq if rows else after,
        run_status=run.status,
        complete=run.status in run_rules.FINISHED and len(rows) < limit,
    )


def artifact_page(ctx: Context, *, run_id: str, caller: Principal) -> Page[ArtifactPublic]:
    rows = runs.list_artifacts(ctx, run_id=run_id, caller=caller)
    return Page[ArtifactPublic](items=[ArtifactPublic.of(a) for a in rows], next_cursor=None)


def approval_page(rows: list[Approval], next_cursor: str | None) -> Page[ApprovalPublic]:
    items = [ApprovalPublic.of(a) for a in rows]
    return Page[ApprovalPublic](items=items, next_cursor=next_cursor)


def approval_decided(ctx: Context, *, approval_id: str, caller: Principal) -> ApprovalDecided:
    """An approval after a decision, with the status its run moved to."""
    approval = approvals.get_approval(ctx, approval_id=approval_id, caller=caller)
    run = runs.get_run(ctx, run_id=approval.run_id, caller=caller)
    return ApprovalDecided.of(approval, run_status=run.status)


def tool_call_page(ctx: Context, *, run_id: str, caller: Principal) -> Page[ToolCallPublic]:
    runs.get_run(ctx, run_id=run_id, caller=caller)
    rows: list[ToolCall] = agent_runs.list_tool_calls(ctx, run_id=run_id, caller=caller)
    return Page[ToolCallPublic](items=[ToolCallPublic.of(c) for c in rows], next_cursor=None)


def transcript_public(ctx: Context, *, run_id: str, caller: Principal) -> TranscriptPublic | None:
    transcript = agent_runs.load_transcript(ctx, run_id=run_id, caller=caller)
    if transcript is None:
        return None
    return TranscriptPublic.of(transcript)
