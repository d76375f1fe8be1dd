"""`floom replay RUN --exact | --against VERSION | --model M` and `floom eval`: replays of
agent runs from their recordings, and evals over many; thin clients of the REST API."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.text import Text

from floom.cli.common import JsonOpt, open_client
from floom.cli.output import fail, new_table, out, print_json
from floom.client.rest import FloomClient
from floom.schemas.replays import EvalReport, EvalStart, Pair, ReplayReport

POLL_SECONDS = 0.3


def replay_from_recording(
    client: FloomClient,
    run_id: str,
    *,
    exact: bool,
    against: str | None,
    model: str | None,
    as_json: bool,
    timeout: float | None,
) -> bool:
    """Start a replay, wait for its report and print it; True when it went as hoped (an
    exact replay reproduced the run, a what-if replay finished)."""
    if exact and (against or model):
        fail("--exact replays the recorded model; use --against or --model for a what-if")
    mode = "exact" if exact else "what_if"
    started = client.start_replay(run_id, mode=mode, version_id=against, model=model)
    if not as_json:
        out.print(Text(f"replay {started.id} of {run_id} ({mode})", style="dim"))
    deadline = time.monotonic() + timeout if timeout else None
    report = client.get_replay(started.id)
    while not report.finished:
        if deadline is not None and time.monotonic() > deadline:
            fail(
                f"stopped waiting; replay {started.id} goes on",
                f"see it later with `floom show {started.id}`",
            )
        time.sleep(POLL_SECONDS)
        report = client.get_replay(started.id)
    if as_json:
        print_json(report)
    else:
        print_report(report)
    return report.reproduced is not False


def print_report(report: ReplayReport) -> None:
    diff = report.diff
    unknown = Pair(original=None, replay=None)
    status = diff.status if diff else unknown
    out.print(Text(f"status: {status.original} -> {status.replay}"))
    if report.mode == "exact":
        if report.reproduced:
            out.print(Text("reproduced: same tool calls, outputs and status", style="green"))
        else:
            where = report.divergence or {}
            out.print(Text(f"diverged at {where.get('step')}", style="red"))
            out.print(Text(f"  expected: {where.get('expected')}"))
            out.print(Text(f"  actual:   {where.get('actual')}"))
    if diff and diff.outputs.equal:
        out.print(Text("outputs: equal"))
    elif diff:
        for name, different in diff.outputs.different.items():
            out.print(Text(f"output {name}: {different.original!r} -> {different.replay!r}"))
    table = new_table("change", "tool", "arguments", "status")
    if diff:
        calls = diff.tool_calls
        for kind, listed in (("added", calls.added), ("removed", calls.removed)):
            for call in listed:
                table.add_row(kind, call.tool, str(call.arguments)[:80], call.status)
        for changed in calls.changed:
            new = changed.replay
            table.add_row("changed", new.tool, str(new.arguments)[:80], new.status)
    if table.row_count:
        out.print(table)
    for key in ("turns", "tokens", "cost_usd"):
        pair = getattr(diff, key) if diff else unknown
        out.print(Text(f"{key}: {pair.original} -> {pair.replay}"))
    if report.refused_calls:
        out.print(Text(f"refused (not in the recording): {report.refused_calls}"))


def register(app: typer.Typer) -> None:
    """Add `floom eval` to the floom command (`floom replay` lives with the run commands)."""
    app.command("eval")(eval_command)


def eval_command(
    worker: Annotated[str, typer.Argument(help="worker name")],
    against: Annotated[
        str | None,
        typer.Option("--against", help="the version to test (default: the active one)"),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="another model to test")] = None,
    runs: Annotated[
        str,
        typer.Option("--runs", help="last:N, status:S, since:ISO, between:ISO..ISO or ids:RUN,RUN"),
    ] = "last:20",
    as_json: JsonOpt = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="stop waiting after S seconds")
    ] = None,
) -> None:
    """Replay a worker's recorded runs against a version or model and report the differences.

    Exits 1 when any replayed run's outputs differ from the original's."""
    start = EvalStart(runs=runs, version_id=against, model=model)
    with open_client() as client:
        report = client.start_eval(worker, start)
        deadline = time.monotonic() + timeout if timeout else None
        while not report.finished:
            if deadline is not None and time.monotonic() > deadline:
                fail(f"stopped waiting; eval {report.id} goes on")
            time.sleep(POLL_SECONDS)
            report = client.get_eval(report.id)
    if as_json:
        print_json(report)
    else:
        print_eval(report)
    if report.totals.outputs_different:
        raise typer.Exit(1)


def print_eval(report: EvalReport) -> None:
    table = new_table("run", "replay", "status", "outputs", "tool calls", "refused", "tokens")
    for item in report.items:
        tokens = item.tokens or Pair(original=None, replay=None)
        table.add_row(
            item.original_run_id,
            item.replay_run_id,
            f"{item.original_status} -> {item.status}",
            "equal" if item.outputs_equal else "different: " + ", ".join(item.outputs_different),
            "diverged" if item.tool_calls_diverged else "same",
            str(item.refused_calls),
            f"{tokens.original} -> {tokens.replay}",
        )
    out.print(table)
    t = report.totals
    out.print(
        Text(
            f"{t.runs} runs: {t.outputs_equal} outputs equal, {t.outputs_different} "
            f"different, {t.tool_calls_diverged} with diverged tool calls, "
            f"{t.refused_calls} refused calls; tokens {t.tokens.original} -> "
            f"{t.tokens.replay}, cost ${t.cost_usd.original} -> ${t.cost_usd.replay}"
        )
    )
