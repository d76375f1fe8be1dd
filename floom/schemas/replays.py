"""Replays and evals, as answered."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from floom.schemas.common import Public, RunStatusWord, Timestamp
from floom.vocabulary import ReplayMode


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
    diff: dict[str, Any] | None = Field(
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


class EvalReport(Public):
    id: str
    worker: str
    version_id: str
    model: str | None
    runs_selector: str
    created_at: Timestamp
    finished: bool
    totals: dict[str, Any] = Field(
        description="runs, finished, outputs_equal, outputs_different, tool_calls_diverged, "
        "refused_calls, tokens and cost_usd (original and replay)"
    )
    items: list[dict[str, Any]] = Field(description="one per replayed run")


def eval_report(body: dict[str, Any]) -> EvalReport:
    return EvalReport.model_validate(body)
