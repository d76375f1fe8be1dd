"""Runs, their log events, artifacts, tool calls, approvals and transcripts, as answered."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from floom.hints.surface import tell
from floom.schemas.common import (
    ApprovalKindWord,
    ApprovalStatusWord,
    Page,
    Public,
    RunErrorCodeWord,
    RunStatusWord,
    RunTriggerWord,
    Timestamp,
    ToolCallStatusWord,
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


class RunError(Public):
    code: RunErrorCodeWord | None
    message: str | None


class RunUsage(Public):
    sandbox_seconds: float


class ArtifactPublic(Public):
    name: str
    size: int
    digest: str
    content_type: str
    url: str = Field(description="where to download it (a path on this server)")
    scanned: bool = Field(
        True,
        description="false when floom could not scan it for secrets (compressed or "
        "encrypted): only keys with the run scope may download it",
    )


class RunPublic(Public):
    id: str
    worker: str
    version_id: str
    status: RunStatusWord
    trigger: RunTriggerWord
    inputs: dict[str, Any]
    outputs: dict[str, Any] | None
    error: RunError | None
    exit_code: int | None
    attempt: int
    max_attempts: int
    previous_attempt: str | None = Field(
        None,
        description="how the attempt before this one ended: interrupted (its node shut "
        "down), lost (its node died) or failed (retried); null on a first attempt",
        json_schema_extra={"enum": ["interrupted", "lost", "failed", None]},
    )
    replay_of: str | None
    retry_of: str | None
    parent_run_id: str | None
    phase: str | None
    created_by: str | None = Field(
        None,
        description="who started it: an API key's id, or what floom started it for (an agent "
        "id, a label); null when floom started it on its own (a schedule, a webhook)",
    )
    scheduled_for: Timestamp | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    cancel_requested: bool
    usage: RunUsage
    artifacts: list[ArtifactPublic] = Field(
        default_factory=list, description="present where the answer lists them"
    )
    state_base: int | None = Field(
        None,
        description="for a worker with state: the state version the run started from (0: none "
        "yet); present once an attempt read it (a replay: from its creation)",
    )

    cannot_start: str | None = Field(
        None,
        description="present on a queued run (in a run's own answers) when no live node can "
        "run it: why, and what starts one",
    )

    omit_when_unset = frozenset({"artifacts", "state_base", "cannot_start"})


class ApprovalPublic(Public):
    id: str
    run_id: str
    worker: str
    kind: ApprovalKindWord
    tool: str | None
    tool_call_id: str | None
    status: ApprovalStatusWord
    proposed: Any
    edited: Any
    comment: str | None
    decided_by: str | None
    created_at: Timestamp
    decided_at: Timestamp | None


class ApprovalDecided(ApprovalPublic):
    run_status: RunStatusWord


class ToolCallPublic(Public):
    id: str
    seq: int
    tool: str
    status: ToolCallStatusWord
    arguments: Any
    result: str | None
    result_size: int | None
    error: str | None
    duration_ms: int | None
    approval_id: str | None
    attempt: int
    created_at: Timestamp


class ModelUsage(Public):
    model: str
    iterations: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float


class RunDetail(RunPublic):
    """A run with everything recorded about it (an agent run's tool calls and model use)."""

    tool_calls: list[ToolCallPublic]
    approvals: list[ApprovalPublic]
    model_usage: ModelUsage | None


class RunEventPublic(Public):
    seq: int
    ts: Timestamp
    stream: str
    line: str
    attempt: int


class LogPage(Public):
    items: list[RunEventPublic]
    last_seq: int = Field(description="pass as `after` to read on")
    run_status: RunStatusWord
    complete: bool = Field(description="the run has ended and every event has been read")


class TranscriptPublic(Public):
    run_id: str
    system: str
    messages: list[Any]
    usage: ModelUsage
    active_seconds: float
    updated_at: Timestamp


# -- builders: the one place each body is assembled ---------------------------------------------


def run_public(run: Run, *, surface: Surface, artifacts: list[Artifact] | None = None) -> RunPublic:
    return RunPublic.model_validate(_told(runs.run_to_dict(run, artifacts=artifacts), surface))


def started_run(ctx: Context, run: Run, *, surface: Surface) -> RunPublic:
    """A run just queued, as its starter is told: with why it cannot start, if no node can
    run it."""
    body = runs.run_to_dict(run, artifacts=[])
    _say_if_stuck(ctx, body)
    return RunPublic.model_validate(_told(body, surface))


def _say_if_stuck(ctx: Context, body: dict[str, Any]) -> None:
    if body["status"] == run_rules.QUEUED and not nodes.live_executor_ids(ctx):
        body["cannot_start"] = nodes.RUN_CANNOT_START


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
    body = runs.run_to_dict(run, artifacts=record.artifacts)
    body.update(run_records.run_extras(ctx, run=run, run_approvals=record.approvals, caller=caller))
    _say_if_stuck(ctx, body)
    return RunDetail.model_validate(_told(body, caller.surface))


def _told(body: dict[str, Any], surface: Surface) -> dict[str, Any]:
    # A stored error may name what to do as a floom command (set a secret, then replay).
    if body.get("error"):
        body["error"] = {
            **body["error"],
            "message": tell(body["error"]["message"], surface=surface),
        }
    return body


def event_public(event: RunEvent, *, surface: Surface) -> RunEventPublic:
    body = logs.event_to_dict(event)
    if body["stream"] == "system":
        # floom's own notices name what to do next (decide an approval) as floom commands;
        # what the script printed is its own and stays as printed.
        body["line"] = tell(body["line"], surface=surface)
    return RunEventPublic.model_validate(body)


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


def artifact_public(artifact: Artifact) -> ArtifactPublic:
    return ArtifactPublic.model_validate(runs.artifact_to_dict(artifact))


def artifact_page(ctx: Context, *, run_id: str, caller: Principal) -> Page[ArtifactPublic]:
    rows = runs.list_artifacts(ctx, run_id=run_id, caller=caller)
    return Page[ArtifactPublic](items=[artifact_public(a) for a in rows], next_cursor=None)


def approval_public(approval: Approval) -> ApprovalPublic:
    return ApprovalPublic.model_validate(approvals.approval_to_dict(approval))


def approval_page(rows: list[Approval], next_cursor: str | None) -> Page[ApprovalPublic]:
    return Page[ApprovalPublic](items=[approval_public(a) for a in rows], next_cursor=next_cursor)


def approval_decided(ctx: Context, *, approval_id: str, caller: Principal) -> ApprovalDecided:
    """An approval after a decision, with the status its run moved to."""
    approval = approvals.get_approval(ctx, approval_id=approval_id, caller=caller)
    body = approvals.approval_to_dict(approval)
    body["run_status"] = runs.get_run(ctx, run_id=body["run_id"], caller=caller).status
    return ApprovalDecided.model_validate(body)


def tool_call_public(call: ToolCall) -> ToolCallPublic:
    return ToolCallPublic.model_validate(agent_runs.tool_call_to_dict(call))


def tool_call_page(ctx: Context, *, run_id: str, caller: Principal) -> Page[ToolCallPublic]:
    runs.get_run(ctx, run_id=run_id, caller=caller)
    rows = agent_runs.list_tool_calls(ctx, run_id=run_id, caller=caller)
    return Page[ToolCallPublic](items=[tool_call_public(c) for c in rows], next_cursor=None)


def transcript_public(ctx: Context, *, run_id: str, caller: Principal) -> TranscriptPublic | None:
    transcript = agent_runs.load_transcript(ctx, run_id=run_id, caller=caller)
    if transcript is None:
        return None
    return TranscriptPublic.model_validate(agent_runs.transcript_to_dict(transcript))
