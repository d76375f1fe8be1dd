"""floom's replay and eval tools over MCP: replay an agent run from its recording (exact or
what-if) and run evals over a worker's recorded runs; written against the Backend interface."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations
from pydantic import Field

from floom.mcp.render import Reply, short
from floom.mcp.toolkit import MAX_WAIT_SECONDS, READ, FloomTool, backend_of, floom_tool, off
from floom.schemas.common import OneOf
from floom.schemas.replays import EvalReport, EvalStart, ReplayReport
from floom.vocabulary import ReplayMode

POLL_SECONDS = 0.5
R = TypeVar("R", ReplayReport, EvalReport)
WaitSeconds = Annotated[
    float, Field(ge=0, le=MAX_WAIT_SECONDS, description="wait up to this long for the report")
]


async def _until_finished(fetch: Callable[[], R], first: R, seconds: float) -> R:
    report, deadline = first, time.monotonic() + min(seconds, MAX_WAIT_SECONDS)
    while not report.finished and time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
        report = await off(fetch)
    return report


def replay_text(report: ReplayReport) -> str:
    head = f"replay {report.run_id} of {report.original_run_id} ({report.mode})"
    if not report.finished or report.diff is None:
        return f"{head}: {report.status}; ask again with get_replay"
    diff = report.diff
    lines = [f"{head}: {diff.status.original} -> {diff.status.replay}"]
    if report.mode == "exact":
        lines.append(
            "reproduced the original"
            if report.reproduced
            else f"diverged at {short(report.divergence, 600)}"
        )
    outputs = diff.outputs
    differ = f"outputs differ: {short(outputs.to_json(), 800)}"
    lines.append("outputs equal" if outputs.equal else differ)
    counts = diff.tool_calls.counts
    lines.append(
        f"tool calls: {counts.added} added, {counts.removed} removed, "
        f"{counts.changed} changed; {report.refused_calls} refused (not in the "
        f"recording); tokens {diff.tokens.original} -> {diff.tokens.replay}"
    )
    return "\n".join(lines)


def eval_text(report: EvalReport) -> str:
    t = report.totals
    state = "finished" if report.finished else f"{t.finished} of {t.runs} finished"
    return (
        f"eval {report.id} of {report.worker} against {report.version_id} ({state}): "
        f"{t.outputs_equal} outputs equal, {t.outputs_different} different, "
        f"{t.tool_calls_diverged} with diverged tool calls, {t.refused_calls} refused "
        f"calls; tokens {t.tokens.original} -> {t.tokens.replay}"
    )


@floom_tool
async def replay_recorded_run(
    ctx: Context,
    run_id: Annotated[str, Field(description="a finished agent run")],
    mode: Annotated[
        Annotated[ReplayMode, OneOf(ReplayMode, strict=True)],
        Field(description="exact: no model, no tool; what_if: the model live, tools recorded"),
    ] = ReplayMode.EXACT,
    version_id: Annotated[
        str | None, Field(description="what_if: the version to test (default: the active one)")
    ] = None,
    model: Annotated[str | None, Field(description="what_if: another model")] = None,
    wait_seconds: WaitSeconds = 60,
) -> Reply:
    """Replay an agent run from its recording, without touching the world: exact (proves
    the record reproduces) or what-if (another version or model); returns the diff."""
    backend = backend_of(ctx)
    run = await off(backend.start_replay, run_id, mode=mode, version_id=version_id, model=model)
    first = await off(backend.get_replay, run.id)
    report = await _until_finished(lambda: backend.get_replay(run.id), first, wait_seconds)
    return Reply(replay_text(report), report.to_json())


@floom_tool
async def get_replay(
    ctx: Context, run_id: Annotated[str, Field(description="the replay's run id")]
) -> Reply:
    """A replay's report: its status and, once finished, the diff against the original."""
    report = await off(backend_of(ctx).get_replay, run_id)
    return Reply(replay_text(report), report.to_json())


@floom_tool
async def eval_worker(
    ctx: Context,
    worker: Annotated[str, Field(description="worker name")],
    runs: Annotated[
        str, Field(description="last:N, status:S, since:ISO, between:ISO..ISO or ids:A,B")
    ] = "last:20",
    version_id: Annotated[
        str | None, Field(description="the version to test (default: the active one)")
    ] = None,
    model: Annotated[str | None, Field(description="another model to test")] = None,
    wait_seconds: WaitSeconds = 60,
) -> Reply:
    """Replay a worker's recorded runs against a version or model (what-if) and report
    outputs equal or different, diverged tool calls, refused calls, tokens and cost."""
    backend = backend_of(ctx)
    start = EvalStart(runs=runs or "last:20", version_id=version_id or None, model=model or None)
    first = await off(backend.start_eval, worker, start)
    report = await _until_finished(lambda: backend.get_eval(first.id), first, wait_seconds)
    return Reply(eval_text(report), report.to_json())


@floom_tool
async def get_eval(
    ctx: Context, eval_id: Annotated[str, Field(description="eval id, e.g. evl_...")]
) -> Reply:
    """An eval's report: per run and in total."""
    report = await off(backend_of(ctx).get_eval, eval_id)
    return Reply(eval_text(report), report.to_json())


# A replay calls the model (what-if) but never acts on the world through tools.
REPLAYS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)

# Each tool's hints and the scope a key needs for it (floom.mcp.toolkit.FloomTool).
REPLAY_TOOLS: tuple[FloomTool, ...] = (
    FloomTool(replay_recorded_run, REPLAYS, "run"),
    FloomTool(get_replay, READ, "read"),
    FloomTool(eval_worker, REPLAYS, "run"),
    FloomTool(get_eval, READ, "read"),
)
