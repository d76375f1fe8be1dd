"""`floom run`, `replay`, `runs`, `show`, `logs`, `cancel` and `artifacts`: thin clients of
the runs REST API, and following a run until it ends."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from floom.cli.commands.approvals import print_agent_details
from floom.cli.commands.replay import replay_from_recording
from floom.cli.common import JsonOpt, RawOpt, json_object_option, open_client
from floom.cli.output import (
    err,
    fail,
    human_size,
    log_line,
    new_table,
    out,
    print_json,
    print_outcome,
    print_result,
    run_heading,
    status_text,
    took,
    value_text,
    when,
)
from floom.client.rest import FloomClient
from floom.client.wire import WAIT_CALL_SECONDS
from floom.schemas.runs import RunPublic, RunQuery, RunRequest
from floom.services.runs.statuses import FINISHED as TERMINAL_STATUSES
from floom.vocabulary import RunStatus, RunTrigger


def register(app: typer.Typer) -> None:
    """Add the run commands to the floom command."""
    app.command()(run)
    app.command()(replay)
    app.command("runs")(list_runs)
    app.command()(show)
    app.command()(logs)
    app.command()(cancel)
    app.command()(artifacts)


def _parse_inputs(pairs: list[str], raw_json: str | None) -> tuple[dict[str, Any], bool]:
    """The inputs to send and whether they are command-line text (coerce_strings)."""
    if pairs and raw_json is not None:
        raise typer.BadParameter("use either -i KEY=VALUE or --input-json, not both")
    if raw_json is not None:
        example = '{"name": "Ada"}'
        return json_object_option(raw_json, option="--input-json", example=example), False
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"expected KEY=VALUE, got '{pair}'", param_hint="'-i' / '--input'"
            )
        inputs[key.strip()] = value
    return inputs, True


def _follow(client: FloomClient, run_id: str, *, after: int, deadline: float | None) -> None:
    for event in client.follow(run_id, after=after, deadline=deadline):
        if event.kind == "log":
            out.print(log_line(event.data))


def watch_run(
    client: FloomClient,
    run: RunPublic,
    *,
    as_json: bool,
    timeout: float | None,
    shown: int | None = None,
) -> None:
    """Wait for a run to end, printing its log (or only its record with --json). `shown`:
    the heading and the log up to this seq are printed already (by the quick path, whose
    stream broke off)."""
    deadline = time.monotonic() + timeout if timeout else None
    run_id = run.id
    try:
        if as_json:
            final = client.wait(run_id, deadline=deadline)
            print_json(final)
        else:
            if shown is None:
                out.print(run_heading(run.to_json()))
            _follow(client, run_id, after=shown or 0, deadline=deadline)
            final = client.get_run(run_id)
            print_result(final.to_json())
    except KeyboardInterrupt:
        stopped_waiting(run_id)
    if final.status != RunStatus.SUCCEEDED:
        raise typer.Exit(1)


def watch_started(
    client: FloomClient,
    started: dict[str, Any],
    *,
    as_json: bool,
    timeout: float | None,
    shown: int | None = None,
) -> None:
    """watch_run for a run the quick path started (its JSON, read without pydantic)."""
    run = RunPublic.model_validate(started)
    watch_run(client, run, as_json=as_json, timeout=timeout, shown=shown)


def say_if_stuck(run: RunPublic) -> None:
    """Warn (on stderr) of a run that no node can start: waiting for it would never end."""
    if run.cannot_start:
        err.print(Text(f"warning: run {run.id} is queued, but {run.cannot_start}", "yellow"))


def stopped_waiting(run_id: str) -> NoReturn:
    """Ctrl-C while following a run: it goes on without us."""
    fail(f"stopped waiting; run {run_id} goes on", f"follow it with `floom logs -f {run_id}`")


WaitOpt = Annotated[bool, typer.Option("--wait", help="follow the run until it ends")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="run even though the worker is paused (a deploy-scoped key)")
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0, help="with --wait: stop waiting after S seconds"),
]


def run(
    worker: Annotated[str, typer.Argument(help="worker name")],
    inputs: Annotated[
        list[str] | None,
        typer.Option("-i", "--input", metavar="KEY=VALUE", help="an input, as text"),
    ] = None,
    input_json: Annotated[
        str | None,
        typer.Option("--input-json", metavar="JSON", help="all inputs as a JSON object (or @file)"),
    ] = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    force: ForceOpt = False,
    raw: RawOpt = False,
    callback_url: Annotated[
        str | None,
        typer.Option(
            "--callback-url",
            metavar="URL",
            help="POST the run's record here when it ends (signed; see floom alerts callback-key)",
        ),
    ] = None,
) -> None:
    """Start a run; with --wait, follow its log and exit 0 only if it succeeded."""
    values, coerce = _parse_inputs(inputs or [], input_json)
    start = RunRequest(inputs=values, coerce_strings=coerce, force=force, callback_url=callback_url)
    waits = wait or timeout is not None
    with open_client() as client:
        if waits and as_json:
            # Only the result is wanted: the start request itself waits for the end (one
            # round trip); watch_run takes over only if the run outlasts that request.
            asked = time.monotonic()
            started = client.start_run(
                worker,
                start,
                wait=min(timeout, WAIT_CALL_SECONDS) if timeout else WAIT_CALL_SECONDS,
            )
            if started.status in TERMINAL_STATUSES:
                print_json(started)
                if started.status != RunStatus.SUCCEEDED:
                    raise typer.Exit(1)
                return
            if timeout is not None:
                timeout = max(0.001, timeout - (time.monotonic() - asked))
        else:
            started = client.start_run(worker, start)
        say_if_stuck(started)
        if waits:
            watch_run(client, started, as_json=as_json, timeout=timeout)
        elif as_json:
            print_json(started)
        else:
            out.print(Text(started.id))


def replay(
    run_id: Annotated[str, typer.Argument(help="the run to run again")],
    latest: Annotated[
        bool,
        typer.Option(
            "--latest",
            help="use the worker's active version, not the run's (a run-scoped key replays a "
            "run of an older version only so)",
        ),
    ] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="agent runs: re-execute from the recording, calling neither model nor tools",
        ),
    ] = False,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="agent runs: what-if replay of this version, tools answered from the recording",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="agent runs: what-if replay with this model")
    ] = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Run a run's inputs again, as a new run linked to it.

    With --exact, --against or --model, replay an agent run from its recording instead and
    print the diff against the original."""
    with open_client() as client:
        if exact or against or model:
            ok = replay_from_recording(
                client,
                run_id,
                exact=exact,
                against=against,
                model=model,
                as_json=as_json,
                timeout=timeout,
            )
            if not ok:
                raise typer.Exit(1)
            return
        started = client.replay_run(run_id, latest=latest, force=force)
        if wait or timeout is not None:
            watch_run(client, started, as_json=as_json, timeout=timeout)
        elif as_json:
            print_json(started)
        else:
            out.print(Text(started.id))


def list_runs(
    worker: Annotated[str | None, typer.Option(help="only this worker's runs")] = None,
    status: Annotated[
        RunStatus | None, typer.Option(help="queued, running, succeeded, failed...")
    ] = None,
    trigger: Annotated[RunTrigger | None, typer.Option(help="api, schedule, replay, ...")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="runs per page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue after this page")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first."""
    with open_client() as client:
        query = RunQuery(worker=worker, status=status, trigger=trigger, cursor=cursor, limit=limit)
        page = client.list_runs(query)
    if as_json:
        print_json(page)
        return
    table = new_table("RUN", "WORKER", "STATUS", "TRIGGER", "CREATED", "DURATION")
    for r in page.items:
        table.add_row(
            r.id,
            r.worker,
            status_text(r.status),
            r.trigger,
            when(r.created_at),
            took(r.started_at, r.finished_at),
        )
    if table.row_count:
        out.print(table)
    else:
        out.print("no runs match")
    if page.next_cursor:
        flags = [
            f"--{k} {v}"
            for k, v in (("worker", worker), ("status", status), ("trigger", trigger))
            if v
        ]
        command = " ".join(["floom runs", *flags, f"--cursor {page.next_cursor}"])
        out.print(Text(f"more: {command}", style="dim"))


def show(
    run_id: Annotated[str, typer.Argument(help="run id")],
    as_json: JsonOpt = False,
    raw: RawOpt = False,
) -> None:
    """Show one run: status, inputs, outputs, error, artifacts."""
    with open_client() as client:
        r = client.get_run(run_id)
    if as_json:
        print_json(r)
        return
    rows: list[tuple[str, Any]] = [
        ("run", r.id),
        ("worker", f"{r.worker} ({r.version_id})"),
        ("status", status_text(r.status)),
        ("trigger", r.trigger),
        ("attempt", f"{r.attempt} of {r.max_attempts}"),
        ("replay of", r.replay_of),
        ("scheduled for", when(r.scheduled_for) if r.scheduled_for else None),
        ("retry of", r.retry_of),
        ("created", when(r.created_at)),
        ("started", when(r.started_at)),
        ("finished", when(r.finished_at)),
        ("duration", took(r.started_at, r.finished_at)),
    ]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for label, value in rows:
        if value:
            table.add_row(label, value if isinstance(value, Text) else Text(str(value)))
    out.print(table)
    if r.inputs:
        out.print("inputs:")
        for name, value in r.inputs.items():
            out.print(Text(f"  {name}: {value_text(value)}"))
    print_outcome(r.to_json())
    print_agent_details(r)


def logs(
    run_id: Annotated[str, typer.Argument(help="run id")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="keep following until the run ends")
    ] = False,
    tail: Annotated[
        int | None, typer.Option(min=1, max=10_000, help="only the last N lines")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON event per line")] = False,
    raw: RawOpt = False,
) -> None:
    """Print a run's log lines in order, timestamped, with their stream."""

    def emit(event: dict[str, Any]) -> None:
        if as_json:
            out.print(Text(json.dumps(event, default=str)))
        else:
            out.print(log_line(event))

    with open_client() as client:
        if tail:
            page = client.get_logs(run_id, tail=tail)
            events = page.items
            last_seq = page.last_seq
        else:
            events = client.all_logs(run_id)
            last_seq = events[-1].seq if events else 0
        for event in events:
            emit(event.to_json())
        if not follow:
            return
        try:
            for item in client.follow(run_id, after=last_seq):
                if item.kind == "log":
                    emit(item.data)
                elif not as_json:
                    line = Text(f"run {run_id} ", style="dim")
                    line.append_text(status_text(item.data["status"]))
                    out.print(line)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


def cancel(run_id: Annotated[str, typer.Argument(help="run id")]) -> None:
    """Cancel a queued or running run."""
    with open_client() as client:
        r = client.cancel_run(run_id)
    if r.status in TERMINAL_STATUSES:
        out.print(Text(f"run {run_id} {r.status}"))
    else:
        out.print(Text(f"cancel requested: run {run_id} stops within seconds"))


def artifacts(
    run_id: Annotated[str, typer.Argument(help="run id")],
    download: Annotated[
        str | None, typer.Option("--download", metavar="NAME", help="save this artifact")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="file or folder to save to ('-': stdout)")
    ] = None,
    raw: RawOpt = False,
) -> None:
    """List a run's artifacts, or download one."""
    with open_client() as client:
        if download is None:
            items = client.get_run(run_id).artifacts
            if not items:
                out.print(f"run {run_id} has no artifacts")
                return
            table = new_table("NAME", "SIZE", "TYPE")
            for a in items:
                table.add_row(a.name, human_size(a.size), a.content_type)
            out.print(table)
            return
        data = client.download_artifact(run_id, download)
    if output is not None and str(output) == "-":
        if sys.stdout.isatty() and not raw:
            # A person reads it: as text, control characters shown (--raw for the bytes).
            out.print(Text(data.decode("utf-8", "replace")), end="")
            return
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = output or Path(Path(download).name)
    if target.is_dir():
        target = target / Path(download).name
    try:
        target.write_bytes(data)
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror}", "choose another path with -o PATH")
    out.print(Text(f"saved {download} to {target} ({human_size(len(data))})"))
