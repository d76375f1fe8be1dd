"""`floom workers` (list) and `floom workers delete`: thin clients of the workers REST API."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.text import Text

from floom.cli.output import err, out
from floom.client import FloomClient

workers_app = typer.Typer(
    help="List the deployed workers (no subcommand), or delete one.",
    add_completion=False,
)


def register(app: typer.Typer, *, list_workers: Callable[[], None]) -> None:
    """Add `floom workers`: without a subcommand it lists, as it always has."""

    @workers_app.callback(invoke_without_command=True)
    def workers(ctx: typer.Context) -> None:
        """List deployed workers, or delete one (`floom workers delete NAME`)."""
        if ctx.invoked_subcommand is None:
            list_workers()

    app.add_typer(workers_app, name="workers")


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
    as_json: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """Delete a worker; its triggers stop at once, its runs are kept unless purged.

    Its unfinished runs are cancelled; secrets stay. Needs a key with the deploy scope.
    """
    if not yes:
        what = "and PURGE all its runs, logs and artifacts" if purge_runs else "(its runs are kept)"
        if not typer.confirm(f"delete worker '{name}' {what}?", default=False, err=True):
            err.print(Text("not deleted", style="yellow"))
            raise typer.Exit(1)
    with FloomClient.from_env(surface="cli") as client:
        result = client.delete_worker(name, purge_runs=purge_runs)
    if as_json:
        out.print_json(json.dumps(result))
        return
    out.print(Text(_summary(result)))


def _summary(result: dict[str, Any]) -> str:
    versions = len(result.get("versions") or [])
    runs = (
        f"{result['runs_purged']} run(s) purged, {result['blobs_deleted']} blob(s) freed"
        if result.get("purge_runs")
        else f"{result['runs_kept']} run(s) kept"
    )
    parts = [
        f"deleted worker {result['worker']}: {versions} version(s), {runs}",
        f"{result['triggers_removed']} trigger(s) removed",
    ]
    if result.get("runs_cancelled"):
        parts.append(f"{result['runs_cancelled']} unfinished run(s) cancelled")
    if result.get("runs_stopping"):
        parts.append(f"{result['runs_stopping']} running run(s) asked to stop")
    if result.get("approvals_closed"):
        parts.append(f"{result['approvals_closed']} pending approval(s) closed")
    return "; ".join(parts) + f" (audit {result['deletion_id']})"
