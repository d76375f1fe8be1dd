"""`floom validate`, `deploy`, `versions`, `rollback`, `floom workers` (list, delete) and
`floom state` (get, set, history): thin clients of the workers REST API, plus the local
check of a worker folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from floom import jsonvalues
from floom.cli.common import JsonOpt, open_client
from floom.cli.console import print_json
from floom.cli.output import err, human_size, new_table, out, when
from floom.config import Settings
from floom.hints import cli as cli_hints
from floom.schemas.workers import StateVersionPublic, WorkerDeleted

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest

workers_app = typer.Typer(
    help="List the deployed workers (no subcommand), or delete one.",
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    """Add the worker commands to the floom command."""
    app.command()(validate)
    app.command()(deploy)
    app.command()(versions)
    app.command()(rollback)


state_app = typer.Typer(
    help="A worker's state: get it, set it (or restore a version), list its history.",
    add_completion=False,
)


def register_state(app: typer.Typer) -> None:
    """Add `floom state` to the floom command."""
    app.add_typer(state_app, name="state", no_args_is_help=True)


def register_group(app: typer.Typer) -> None:
    """Add `floom workers`: without a subcommand it lists, as it always has."""
    app.add_typer(workers_app, name="workers")


@workers_app.callback(invoke_without_command=True)
def workers(ctx: typer.Context) -> None:
    """List deployed workers, or delete one (`floom workers delete NAME`)."""
    if ctx.invoked_subcommand is None:
        list_workers()


def _check_locally(folder: Path) -> Manifest:
    # Imported here, not at the top: the manifest schema costs ~27 ms of every CLI start-up.
    from floom.manifest.load import check_folder
    from floom.manifest.schema import format_problems

    manifest, problems = check_folder(folder)
    if manifest is None:
        count = len(problems)
        err.print(
            Text(f"error: {folder} has {count} problem{'s' if count != 1 else ''}:", style="red")
        )
        err.print(Text(format_problems(problems)))
        raise typer.Exit(1)
    return manifest


def validate(folder: Annotated[Path, typer.Argument(help="the worker's folder")]) -> None:
    """Check a worker folder locally (no server needed)."""
    manifest = _check_locally(folder)
    out.print(Text(f"ok: {manifest.name} ({manifest.kind}, entry {manifest.entry})"))


def deploy(
    folder: Annotated[Path, typer.Argument(help="the worker's folder")],
    skip_eval_gate: Annotated[
        bool,
        typer.Option("--skip-eval-gate", help="activate even though the worker's eval gate fails"),
    ] = False,
) -> None:
    """Validate a worker folder, then upload it as a new version and make it active."""
    # Imported here, not at the top: archiving (tarfile, lzma) costs ~4 ms of every CLI start-up.
    from floom.bundle import read_folder

    _check_locally(folder)
    bundle = read_folder(folder, max_bytes=Settings().max_bundle_bytes)
    for why in bundle.left_out:
        err.print(Text(f"left out {cli_hints.written(why)}"))
    archive = bundle.to_archive()
    with open_client() as client:
        result = client.deploy(archive, skip_eval_gate=skip_eval_gate)
    for line in result.left_out:  # what floom itself left out of the upload
        err.print(Text(f"left out {line}"))
    name, version = result.worker.name, result.version.id
    if result.created:
        out.print(Text(f"deployed {name} version {version} (active)"))
    elif result.activated:
        out.print(Text(f"{name} version {version} unchanged; it is the active version again"))
    else:
        out.print(Text(f"{name} version {version} unchanged"))


def list_workers() -> None:
    """List deployed workers."""
    table = new_table("NAME", "KIND", "ACTIVE VERSION", "UPDATED", "TITLE")
    cursor: str | None = None
    with open_client() as client:
        while True:
            page = client.list_workers(cursor=cursor)
            for w in page.items:
                table.add_row(
                    w.name,
                    w.kind or "-",
                    w.active_version_id or "-",
                    when(w.updated_at),
                    w.title or "",
                )
            cursor = page.next_cursor
            if not cursor:
                break
    if table.row_count:
        out.print(table)
    else:
        out.print("no workers yet: deploy one with `floom deploy FOLDER`")


def versions(worker: Annotated[str, typer.Argument(help="worker name")]) -> None:
    """List a worker's versions, newest first; * marks the active one."""
    with open_client() as client:
        items = client.list_versions(worker).items
    table = new_table("", "VERSION", "CREATED", "FILES", "SIZE", "DIGEST")
    for v in items:
        table.add_row(
            "*" if v.active else "",
            v.id,
            when(v.created_at),
            str(v.file_count),
            human_size(v.size),
            v.digest[:12],
        )
    out.print(table)


def rollback(
    worker: Annotated[str, typer.Argument(help="worker name")],
    to: Annotated[str | None, typer.Option("--to", help="version id to activate")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="activate the version of this run")
    ] = None,
    restore_state: Annotated[
        int | None,
        typer.Option(
            "--restore-state",
            min=1,
            help="also set this kept state version again (see `floom state history`)",
        ),
    ] = None,
) -> None:
    """Make an earlier version active again."""
    if (to is None) == (run is None):
        raise typer.BadParameter(
            "give exactly one of --to VERSION or --run RUN_ID", param_hint="'--to' / '--run'"
        )
    with open_client() as client:
        result = client.rollback(worker, version_id=to, run_id=run, state_version=restore_state)
    if restore_state is not None:
        out.print(Text(f"{worker}'s state is version {restore_state}'s again"))
    version = result.version.id
    if not result.changed:
        out.print(Text(f"{worker} already runs version {version}; nothing changed"))
    else:
        out.print(Text(f"{worker} now runs version {version}"))


@workers_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="worker name")],
    purge_runs: Annotated[
        bool,
        typer.Option(
            "--purge-runs",
            help="also delete its runs with their logs, artifacts, tool calls and approvals "
            "(default: keep them readable)",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete a worker; its triggers stop at once, its runs are kept unless purged.

    Its unfinished runs are cancelled; secrets stay. Needs a key with the deploy scope.
    """
    if not yes:
        what = "and PURGE all its runs, logs and artifacts" if purge_runs else "(its runs are kept)"
        if not typer.confirm(f"delete worker '{name}' {what}?", default=False, err=True):
            err.print(Text("not deleted", style="yellow"))
            raise typer.Exit(1)
    with open_client() as client:
        result = client.delete_worker(name, purge_runs=purge_runs)
    if as_json:
        out.print_json(json.dumps(result.to_json()))
        return
    out.print(Text(_summary(result)))


def _summary(result: WorkerDeleted) -> str:
    runs = (
        f"{result.runs_purged} run(s) purged, {result.blobs_deleted} blob(s) freed"
        if result.purge_runs
        else f"{result.runs_kept} run(s) kept"
    )
    parts = [
        f"deleted worker {result.worker}: {len(result.versions)} version(s), {runs}",
        f"{result.triggers_removed} trigger(s) removed",
    ]
    if result.runs_cancelled:
        parts.append(f"{result.runs_cancelled} unfinished run(s) cancelled")
    if result.runs_stopping:
        parts.append(f"{result.runs_stopping} running run(s) asked to stop")
    if result.approvals_closed:
        parts.append(f"{result.approvals_closed} pending approval(s) closed")
    return "; ".join(parts) + f" (audit {result.deletion_id})"


# -- worker state -------------------------------------------------------------------------------


@state_app.command("get")
def state_get(
    name: Annotated[str, typer.Argument(help="worker name")],
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="a kept version (default: current)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a worker's state as JSON on stdout; who wrote it goes to stderr."""
    with open_client() as client:
        body = client.get_state(name, version=version)
    if as_json:
        print_json(body)
        return
    written = body.written
    if written is None:
        err.print(Text(f"{name} has no state yet (version 0)"))
    else:
        err.print(Text(_written_line(body.version, written, current=body.current_version)))
    print_json(body.state)


@state_app.command("set")
def state_set(
    name: Annotated[str, typer.Argument(help="worker name")],
    value: Annotated[
        str | None,
        typer.Argument(help="the new state as JSON; @FILE reads a file, - reads stdin"),
    ] = None,
    from_version: Annotated[
        int | None,
        typer.Option("--from-version", min=1, help="set a kept version's state again"),
    ] = None,
    if_version: Annotated[
        int | None,
        typer.Option("--if-version", min=0, help="only while the current version is this one"),
    ] = None,
) -> None:
    """Set a worker's state (a new version), or restore a kept one with --from-version."""
    if (value is None) == (from_version is None):
        raise typer.BadParameter(
            "give exactly one of a JSON VALUE or --from-version N", param_hint="VALUE"
        )
    with open_client() as client:
        if from_version is not None:
            body = client.set_state(name, from_version=from_version, if_version=if_version)
        else:
            state = _json_value(str(value))
            body = client.set_state(name, state=state, if_version=if_version)
    if body.written is not None:
        out.print(Text(_written_line(body.version, body.written, current=body.version)))


@state_app.command("history")
def state_history(
    name: Annotated[str, typer.Argument(help="worker name")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List a worker's kept state versions, newest first: who wrote each, when, how big."""
    with open_client() as client:
        page = client.state_versions(name, limit=limit)
    if as_json:
        print_json(page)
        return
    if not page.items:
        out.print(f"{name} has no state yet")
        return
    table = new_table("VERSION", "SOURCE", "WRITTEN BY", "SIZE", "WRITTEN")
    for v in page.items:
        source = str(v.source)
        if v.restored_from:
            source += f" of {v.restored_from}"
        table.add_row(
            str(v.version),
            source,
            v.written_by or "-",
            human_size(v.size),
            when(v.created_at),
        )
    out.print(table)


def _json_value(text: str) -> Any:
    """The state given on the command line: JSON text, @FILE or - (stdin)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {text[1:]}: {exc.strerror}", param_hint="VALUE"
            ) from exc
    parsed, breach = jsonvalues.parse(text, where="the state")
    if breach is not None:
        raise typer.BadParameter(
            f'{breach.message}; quote it for the shell, e.g. \'{{"since": "2026-01-01"}}\'',
            param_hint="VALUE",
        )
    return parsed


def _written_line(version: int, written: StateVersionPublic, *, current: int) -> str:
    where = f" from run {written.run_id}" if written.run_id else ""
    restored = f", restored from {written.restored_from}" if written.restored_from else ""
    latest = "" if version == current else f" (current: {current})"
    return (
        f"state version {version}{latest}: {written.source}{restored}{where}, "
        f"written by {written.written_by or '-'} at {when(written.created_at)}"
    )
