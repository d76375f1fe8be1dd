"""Replays and evals, as answered."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from floom.schemas.common import Public, RunStatusWord, Timestamp
from floom.vocabulary import ReplayMode


class Pair(Public):
    """One measure of the original run against the replay's."""

    original: Any
    replay: Any


class OutputDifference(Pair):
    rule: Any = Field(description="the comparison rule the outputs were held to")


class OutputsDiff(Public):
    equal: bool
    different: dict[str, OutputDifference] = Field(description="by output name")


class CallView(Public):
    tool: str
    arguments: Any
    status: str


class ChangedCall(Public):
    original: CallView
    replay: CallView


class CallCounts(Public):
    added: int
    removed: int
    changed: int


class ToolCallsDiff(Public):
    diverged: bool
    added: list[CallView]
    removed: list[CallView]
    changed: list[ChangedCall]
    counts: CallCounts = Field(description="all of them; the lists stop at a few")


class ReplayDiff(Public):
    """A finished replay against its original (floom/services/replays/diff.py)."""

    status: Pair
    outputs: OutputsDiff
    tool_calls: ToolCallsDiff
    turns: Pair
    tokens: Pair
    cost_usd: Pair


class ReplayReport(Public):
    run_id: str = Field(description="the replay: a run of its own")
    original_run_id: str
    mode: str = Field(json_schema_extra={"enum": list(ReplayMode)})
    model: str | None = Field(description="the model a what-if replay was asked to use")
    eval_id: str | None
    version_id: str
    original_version_id: str
    status: RunStatusWord
    finished: bool
    diff: ReplayDiff | None = Field(
        description="once finished: status, outputs, tool_calls (added, removed, changed), "
        "turns, tokens, cost_usd, each original against replay"
    )
    reproduced: bool | None = Field(description="exact replays: the record was reproduced")
    divergence: dict[str, Any] | None = Field(
        description="exact replays: the first step where the replay left the recording"
    )
    refused_calls: int = Field(0, description="tool calls refused as not in the recording")


def replay_report(body: dict[str, Any]) -> ReplayReport:
    return ReplayReport.model_validate(body)


class EvalItem(Public):
    """One replayed run of an eval."""

    original_run_id: str
    replay_run_id: str
    status: RunStatusWord
    finished: bool
    original_status: str | None
    outputs_equal: bool | None
    outputs_different: list[str]
    tool_calls_diverged: bool | None
    refused_calls: int
    tokens: Pair | None
    cost_usd: Pair | None


class EvalTotals(Public):
    runs: int
    finished: int
    outputs_equal: int
    outputs_different: int
    tool_calls_diverged: int
    refused_calls: int
    tokens: Pair
    cost_usd: Pair


class EvalReport(Public):
    id: str
    worker: str
    version_id: str
    model: str | None
    runs_selector: str
    created_at: Timestamp
    finished: bool
    totals: EvalTotals = Field(
        description="runs, finished, outputs_equal, outputs_different, tool_calls_diverged, "
        "refused_calls, tokens and cost_usd (original and replay)"
    )
    items: list[EvalItem] = Field(description="one per replayed run")


def eval_report(body: dict[str, Any]) -> EvalReport:
    return EvalReport.model_validate(body)


# -- requests ------------------------------------------------------------------------------------


class EvalStart(BaseModel):
    """An eval to start: the one shape of POST /api/v1/workers/{name}/evals's body, the
    client's start_eval, both MCP backends and the eval_worker tool, and `floom eval`."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused

    runs: str = Field(
        "last:20",
        max_length=400,
        description="which recorded runs: last:N, status:S, since:T, between:T..T, ids:A,B",
    )
    version_id: str | None = Field(
        None, max_length=40, description="the version to test (default: the active one)"
    )
    model: str | None = Field(None, max_length=128, description="another model to test")
