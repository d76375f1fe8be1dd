"""The floom command: a thin client of the REST API, plus `serve`, which runs the server."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from floom.cli import admin, approvals, handoffs, mcp, triggers, workers
from floom.cli.output import (
    _duration,
    _fail,
    _log_line,
    _print_json,
    _print_outcome,
    _print_result,
    _size,
    _status,
    _table,
    _value,
    _when,
    err,
    out,
)
from floom.client import TERMINAL_STATUSES, FloomClient
from floom.errors import FloomError

if TYPE_CHECKING:
    from floom.manifest import Manifest

app = typer.Typer(
    name="floom",
    help="Deploy, run and inspect background AI workers on a floom server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# -- shared helpers --------------------------------------------------------------------------


def _client() -> FloomClient:
    return FloomClient.from_env(surface="cli")


def _check_locally(folder: Path) -> Manifest:
    from floom.manifest import check_folder, format_problems

    manifest, problems = check_folder(folder)
    if manifest is None:
        count = len(problems)
        err.print(
            Text(f"error: {folder} has {count} problem{'s' if count != 1 else ''}:", style="red")
        )
        err.print(Text(format_problems(problems)))
        raise typer.Exit(1)
    return manifest


# -- server ----------------------------------------------------------------------------------


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="address to bind (FLOOM_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (FLOOM_PORT)")] = None,
) -> None:
    """Run the floom server: API, scheduler and executor in one process."""
    import uvicorn

    from floom.api.app import create_app, preflight
    from floom.config import Settings, mask_password
    from floom.sandbox import get_sandbox
    from floom.sandbox.base import describe_protections

    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = Settings(**overrides)
    url = settings.public_url or f"http://{settings.host}:{settings.port}"
    out.print(
        Text(
            f"floom on {url}  data dir {settings.data_dir}  "
            f"database {mask_password(settings.resolved_database_url)}"
        )
    )
    try:
        ctx = preflight(settings)
    except FloomError as exc:
        _fail(exc.message, exc.hint)
    if "executor" in settings.role_set:
        protections = get_sandbox(settings.sandbox, settings).protections()
        out.print(Text(f"sandbox {settings.sandbox}: {describe_protections(protections)}"))
    uvicorn.run(create_app(ctx=ctx), host=settings.host, port=settings.port, log_level="info")


# -- workers ---------------------------------------------------------------------------------


@app.command()
def validate(folder: Annotated[Path, typer.Argument(help="the worker's folder")]) -> None:
    """Check a worker folder locally (no server needed)."""
    manifest = _check_locally(folder)
    out.print(Text(f"ok: {manifest.name} ({manifest.kind}, entry {manifest.entry})"))


@app.command()
def deploy(folder: Annotated[Path, typer.Argument(help="the worker's folder")]) -> None:
    """Validate a worker folder, then upload it as a new version and make it active."""
    from floom.bundle import read_folder
    from floom.config import Settings

    _check_locally(folder)
    archive = read_folder(folder, max_bytes=Settings().max_bundle_bytes).to_archive()
    with _client() as client:
        result = client.deploy(archive)
    name, version = result["worker"]["name"], result["version"]["id"]
    if result["created"]:
        out.print(Text(f"deployed {name} version {version} (active)"))
    elif result["activated"]:
        out.print(Text(f"{name} version {version} unchanged; it is the active version again"))
    else:
        out.print(Text(f"{name} version {version} unchanged"))


def list_workers() -> None:
    """List deployed workers."""
    table = _table("NAME", "KIND", "ACTIVE VERSION", "UPDATED", "TITLE")
    cursor: str | None = None
    with _client() as client:
        while True:
            page = client.list_workers(cursor=cursor)
            for w in page["items"]:
                table.add_row(
                    w["name"],
                    w.get("kind", "-"),
                    w.get("active_version_id") or "-",
                    _when(w.get("updated_at")),
                    w.get("title", ""),
                )
            cursor = page.get("next_cursor")
            if not cursor:
                break
    if table.row_count:
        out.print(table)
    else:
        out.print("no workers yet: deploy one with `floom deploy FOLDER`")


@app.command()
def versions(worker: Annotated[str, typer.Argument(help="worker name")]) -> None:
    """List a worker's versions, newest first; * marks the active one."""
    with _client() as client:
        items = client.list_versions(worker)["items"]
    table = _table("", "VERSION", "CREATED", "FILES", "SIZE", "DIGEST")
    for v in items:
        table.add_row(
            "*" if v.get("active") else "",
            v["id"],
            _when(v.get("created_at")),
            str(v.get("file_count", "-")),
            _size(v.get("size")),
            str(v.get("digest", ""))[:12],
        )
    out.print(table)


@app.command()
def rollback(
    worker: Annotated[str, typer.Argument(help="worker name")],
    to: Annotated[str | None, typer.Option("--to", help="version id to activate")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="activate the version of this run")
    ] = None,
) -> None:
    """Make an earlier version active again."""
    if (to is None) == (run is None):
        raise typer.BadParameter(
            "give exactly one of --to VERSION or --run RUN_ID", param_hint="'--to' / '--run'"
        )
    with _client() as client:
        result = client.rollback(worker, version_id=to, run_id=run)
    out.print(Text(f"{worker} now runs version {result['version']['id']}"))


# -- runs ------------------------------------------------------------------------------------


def _parse_inputs(pairs: list[str], raw_json: str | None) -> tuple[dict[str, Any], bool]:
    """The inputs to send and whether they are command-line text (coerce_strings)."""
    if pairs and raw_json is not None:
        raise typer.BadParameter("use either -i KEY=VALUE or --input-json, not both")
    if raw_json is not None:
        text = raw_json
        if raw_json.startswith("@"):
            try:
                text = Path(raw_json[1:]).read_text()
            except OSError as exc:
                raise typer.BadParameter(f"cannot read {raw_json[1:]}: {exc.strerror}") from exc
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="--input-json") from exc
        if not isinstance(value, dict):
            raise typer.BadParameter(
                'expected a JSON object such as {"name": "Ada"}', param_hint="--input-json"
            )
        return value, False
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
            out.print(_log_line(event.data))


def _watch(
    client: FloomClient, run: dict[str, Any], *, as_json: bool, timeout: float | None
) -> None:
    """Wait for a run to end, printing its log (or only its record with --json)."""
    deadline = time.monotonic() + timeout if timeout else None
    run_id = run["id"]
    try:
        if as_json:
            final = client.wait(run_id, deadline=deadline)
            _print_json(final)
        else:
            out.print(Text(f"run {run_id} of {run['worker']} ({run['version_id']})", style="dim"))
            _follow(client, run_id, after=0, deadline=deadline)
            final = client.get_run(run_id)
            _print_result(final)
    except KeyboardInterrupt:
        _fail(f"stopped waiting; run {run_id} goes on", f"follow it with `floom logs -f {run_id}`")
    if final["status"] != "succeeded":
        raise typer.Exit(1)


WaitOpt = Annotated[bool, typer.Option("--wait", help="follow the run until it ends")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON only")]
ForceOpt = Annotated[bool, typer.Option("--force", help="run even though the worker is paused")]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0, help="with --wait: stop waiting after S seconds"),
]


@app.command()
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
) -> None:
    """Start a run; with --wait, follow its log and exit 0 only if it succeeded."""
    values, coerce = _parse_inputs(inputs or [], input_json)
    with _client() as client:
        started = client.start_run(worker, values, coerce_strings=coerce, force=force)
        if wait or timeout is not None:
            _watch(client, started, as_json=as_json, timeout=timeout)
        elif as_json:
            _print_json(started)
        else:
            out.print(Text(started["id"]))


@app.command()
def replay(
    run_id: Annotated[str, typer.Argument(help="the run to run again")],
    latest: Annotated[
        bool, typer.Option("--latest", help="use the worker's active version, not the run's")
    ] = False,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Run a run's inputs again, as a new run linked to it."""
    with _client() as client:
        started = client.replay_run(run_id, latest=latest, force=force)
        if wait or timeout is not None:
            _watch(client, started, as_json=as_json, timeout=timeout)
        elif as_json:
            _print_json(started)
        else:
            out.print(Text(started["id"]))


@app.command("runs")
def list_runs(
    worker: Annotated[str | None, typer.Option(help="only this worker's runs")] = None,
    status: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed...")
    ] = None,
    trigger: Annotated[str | None, typer.Option(help="api, schedule, replay, ...")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="runs per page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue after this page")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first."""
    with _client() as client:
        page = client.list_runs(
            worker=worker, status=status, trigger=trigger, cursor=cursor, limit=limit
        )
    if as_json:
        _print_json(page)
        return
    table = _table("RUN", "WORKER", "STATUS", "TRIGGER", "CREATED", "DURATION")
    for r in page["items"]:
        table.add_row(
            r["id"],
            r["worker"],
            _status(r["status"]),
            r["trigger"],
            _when(r.get("created_at")),
            _duration(r),
        )
    if table.row_count:
        out.print(table)
    else:
        out.print("no runs match")
    if page.get("next_cursor"):
        flags = [
            f"--{k} {v}"
            for k, v in (("worker", worker), ("status", status), ("trigger", trigger))
            if v
        ]
        command = " ".join(["floom runs", *flags, f"--cursor {page['next_cursor']}"])
        out.print(Text(f"more: {command}", style="dim"))


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="run id")],
    as_json: JsonOpt = False,
) -> None:
    """Show one run: status, inputs, outputs, error, artifacts."""
    with _client() as client:
        r = client.get_run(run_id)
    if as_json:
        _print_json(r)
        return
    rows: list[tuple[str, Any]] = [
        ("run", r["id"]),
        ("worker", f"{r['worker']} ({r['version_id']})"),
        ("status", _status(r["status"])),
        ("trigger", r["trigger"]),
        ("attempt", f"{r.get('attempt')} of {r.get('max_attempts')}"),
        ("replay of", r.get("replay_of")),
        ("scheduled for", _when(r["scheduled_for"]) if r.get("scheduled_for") else None),
        ("retry of", r.get("retry_of")),
        ("created", _when(r.get("created_at"))),
        ("started", _when(r.get("started_at"))),
        ("finished", _when(r.get("finished_at"))),
        ("duration", _duration(r)),
    ]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for label, value in rows:
        if value:
            table.add_row(label, value if isinstance(value, Text) else Text(str(value)))
    out.print(table)
    if r.get("inputs"):
        out.print("inputs:")
        for name, value in r["inputs"].items():
            out.print(Text(f"  {name}: {_value(value)}"))
    _print_outcome(r)
    approvals.print_agent_details(r)


@app.command()
def logs(
    run_id: Annotated[str, typer.Argument(help="run id")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="keep following until the run ends")
    ] = False,
    tail: Annotated[
        int | None, typer.Option(min=1, max=10_000, help="only the last N lines")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON event per line")] = False,
) -> None:
    """Print a run's log lines in order, timestamped, with their stream."""

    def emit(event: dict[str, Any]) -> None:
        if as_json:
            out.print(Text(json.dumps(event, default=str)))
        else:
            out.print(_log_line(event))

    with _client() as client:
        if tail:
            page = client.get_logs(run_id, tail=tail)
            events = page["items"]
            last_seq = int(page["last_seq"])
        else:
            events = client.all_logs(run_id)
            last_seq = int(events[-1]["seq"]) if events else 0
        for event in events:
            emit(event)
        if not follow:
            return
        try:
            for item in client.follow(run_id, after=last_seq):
                if item.kind == "log":
                    emit(item.data)
                elif not as_json:
                    line = Text(f"run {run_id} ", style="dim")
                    line.append_text(_status(item.data["status"]))
                    out.print(line)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


@app.command()
def cancel(run_id: Annotated[str, typer.Argument(help="run id")]) -> None:
    """Cancel a queued or running run."""
    with _client() as client:
        r = client.cancel_run(run_id)
    if r["status"] in TERMINAL_STATUSES:
        out.print(Text(f"run {run_id} {r['status']}"))
    else:
        out.print(Text(f"cancel requested: run {run_id} stops within seconds"))


@app.command()
def artifacts(
    run_id: Annotated[str, typer.Argument(help="run id")],
    download: Annotated[
        str | None, typer.Option("--download", metavar="NAME", help="save this artifact")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="file or folder to save to ('-': stdout)")
    ] = None,
) -> None:
    """List a run's artifacts, or download one."""
    with _client() as client:
        if download is None:
            items = client.get_run(run_id).get("artifacts", [])
            if not items:
                out.print(f"run {run_id} has no artifacts")
                return
            table = _table("NAME", "SIZE", "TYPE")
            for a in items:
                table.add_row(a["name"], _size(a.get("size")), a.get("content_type", ""))
            out.print(table)
            return
        data = client.download_artifact(run_id, download)
    if output is not None and str(output) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = output or Path(Path(download).name)
    if target.is_dir():
        target = target / Path(download).name
    try:
        target.write_bytes(data)
    except OSError as exc:
        _fail(f"cannot write {target}: {exc.strerror}", "choose another path with -o PATH")
    out.print(Text(f"saved {download} to {target} ({_size(len(data))})"))


admin.register(app)
mcp.register(app)
handoffs.register(app)
approvals.register(app)
triggers.register(app)
workers.register(app, list_workers=list_workers)


def main() -> None:
    """Entry point: floom's errors become "error:" and "hint:" lines and exit code 1."""
    try:
        app()
    except FloomError as exc:
        _exit_with(exc.message, exc.hint, exc.details)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        _exit_with(
            f"invalid setting {where.upper() and 'FLOOM_' + where.upper()}: {first.get('msg')}",
            "check the FLOOM_* environment variables",
        )
    except Exception as exc:  # the outermost boundary: a bug should still not dump a trace
        if os.environ.get("FLOOM_DEBUG"):
            raise
        _exit_with(
            f"unexpected {type(exc).__name__}: {exc}",
            "this is a bug in floom; rerun with FLOOM_DEBUG=1 for the traceback",
        )


def _exit_with(message: str, hint: str | None, details: Any = None) -> NoReturn:
    try:
        _fail(message, hint, details)
    except typer.Exit as done:
        sys.exit(done.exit_code)
