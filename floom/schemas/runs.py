"""Runs, their log events, artifacts, tool calls, approvals and transcripts, as answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field

from floom import jsonvalues
from floom.schemas.common import (
    ApprovalKindWord,
    ApprovalStatusWord,
    PreviousAttemptWord,
    Public,
    RunErrorCodeWord,
    RunStatusWord,
    RunTriggerWord,
    Timestamp,
    ToolCallStatusWord,
)
from floom.services.runs import artifact_scan
from floom.services.runs import rules as run_rules

if TYPE_CHECKING:
    from floom.store.agents import Approval, ToolCall, Transcript
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

    @classmethod
    def of(cls, a: Artifact) -> Self:
        return cls(
            name=a.name,
            size=a.size,
            digest=a.digest,
            content_type=a.content_type,
            url=f"/api/v1/runs/{a.run_id}/artifacts/{a.name}",
            scanned=artifact_scan.scanned(a.content_type),
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
    previous_attempt: PreviousAttemptWord | None = Field(
        None,
        description="how the attempt before this one ended: interrupted (its node shut "
        "down), lost (its node died) or failed (retried); null on a first attempt",
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

    @classmethod
    def of(cls, run: Run, *, artifacts: list[Artifact] | None = None, **extra: Any) -> Self:
        """The run as answered; `artifacts` where the answer lists them, and what a
        subclass adds (`extra`)."""
        if artifacts is not None:
            extra["artifacts"] = [ArtifactPublic.of(a) for a in artifacts]
        if run.state_base is not None:
            extra["state_base"] = run.state_base
        return cls(
            id=run.id,
            worker=run.worker_name,
            version_id=run.version_id,
            status=run.status,
            trigger=run.trigger,
            inputs=jsonvalues.stored(run.inputs_json, expect=dict),
            outputs=jsonvalues.stored(run.outputs_json, expect=dict) if run.outputs_json else None,
            error=(
                RunError(code=run.error_code, message=run.error_message)
                # Between attempts the code says how the last one ended: not the run's error.
                if run.status in run_rules.FINISHED and (run.error_code or run.error_message)
                else None
            ),
            exit_code=run.exit_code,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            previous_attempt=run_rules.previous_attempt(run),
            replay_of=run.replay_of,
            retry_of=run.retry_of,
            parent_run_id=run.parent_run_id,
            phase=run.phase,
            created_by=run.created_by,
            scheduled_for=run.scheduled_for,
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            cancel_requested=run.cancel_requested,
            usage=RunUsage(sandbox_seconds=round(run.sandbox_seconds, 3)),
            **extra,
        )


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

    @classmethod
    def of(cls, a: Approval, **extra: Any) -> Self:
        return cls(
            id=a.id,
            run_id=a.run_id,
            worker=a.worker_name,
            kind=a.kind,
            tool=a.tool,
            tool_call_id=a.tool_call_id,
            status=a.status,
            proposed=jsonvalues.stored(a.proposed_json),
            edited=jsonvalues.stored(a.edited_json) if a.edited_json else None,
            comment=a.comment,
            decided_by=a.decided_by,
            created_at=a.created_at,
            decided_at=a.decided_at,
            **extra,
        )


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

    @classmethod
    def of(cls, c: ToolCall) -> Self:
        return cls(
            id=c.id,
            seq=c.seq,
            tool=c.tool,
            status=c.status,
            arguments=jsonvalues.stored(c.arguments_json),
            result=c.result,
            result_size=c.result_size,
            error=c.error,
            duration_ms=c.duration_ms,
            approval_id=c.approval_id,
            attempt=c.attempt,
            created_at=c.created_at,
        )


class ModelUsage(Public):
    model: str
    iterations: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float

    @classmethod
    def of(cls, t: Transcript) -> Self:
        return cls(
            model=t.model,
            iterations=t.iterations,
            input_tokens=t.input_tokens,
            output_tokens=t.output_tokens,
            total_tokens=t.input_tokens + t.output_tokens,
            cost_usd=round(t.cost_usd, 6),
        )


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

    @classmethod
    def of(cls, e: RunEvent) -> Self:
        return cls(seq=e.seq, ts=e.ts, stream=e.stream, line=e.line, attempt=e.attempt)


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

    @classmethod
    def of(cls, t: Transcript) -> Self:
        return cls(
            run_id=t.run_id,
            system=t.system,
            messages=jsonvalues.stored(t.messages_json, expect=list),
            usage=ModelUsage.of(t),
            active_seconds=round(t.active_seconds, 3),
            updated_at=t.updated_at,
        )


# -- requests ------------------------------------------------------------------------------------


class RunRequest(BaseModel):
    """A run to start: the one shape of POST /api/v1/workers/{name}/runs's body (`?wait=`
    and `until` say how long the request waits, not what runs), the client's start_run, both
    MCP backends and the run_worker tool, and `floom run`."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused

    inputs: dict[str, Any] = Field(default_factory=dict)
    coerce_strings: bool = Field(
        False, description="inputs are text (as typed on a command line); convert by declared type"
    )
    version_id: str | None = Field(
        None,
        description="pin to this version instead of the active (another than the active one: "
        "a deploy-scoped key)",
    )
    force: bool = Field(
        False, description="run even though the worker is paused (a deploy-scoped key)"
    )
    callback_url: str | None = Field(
        None,
        max_length=2048,
        description="POST the run's record here when it ends, signed as Standard Webhooks "
        "(key: GET /api/v1/alerts/callback-key) and retried; checked by the egress guard now",
    )


class RunQuery(BaseModel):
    """Which runs to list, newest first, a page at a time: the one shape of GET
    /api/v1/runs's filters, the client's list_runs, both MCP backends and the list_runs tool,
    and `floom runs`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: str | None = None
    status: str | None = None
    trigger: str | None = None
    cursor: str | None = None
    limit: int = 50

    def params(self) -> dict[str, Any]:
        """As REST query parameters (unset ones left out)."""
        return self.model_dump(exclude_none=True)


class ApprovalQuery(BaseModel):
    """Which approvals to list, oldest first, a page at a time: the one shape of GET
    /api/v1/approvals's filters, the client's list_approvals, both MCP backends and the
    list_approvals tool, and `floom approvals`. No status: the pending ones; "all": every one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str | None = None
    run_id: str | None = None
    worker: str | None = None
    cursor: str | None = None
    limit: int = 50

    def params(self) -> dict[str, Any]:
        """As REST query parameters (unset ones left out: the server lists pending ones)."""
        return self.model_dump(exclude_none=True)
