"""Operator commands that work on this node's store and data dir directly, not through the
API: `floom backup`, `floom restore`, `floom migrate-store`, `floom retention run`,
`floom retention compact`, `floom blobs migrate`, `floom blobs check`, `floom blobs held-back`,
`floom blobs give-up`.

They read the same FLOOM_* settings as `floom serve` (FLOOM_DATA_DIR, FLOOM_DATABASE_URL).
The store (SQLAlchemy, the tables) loads only when one of them is named (floom/cli/index.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from floom.cli.output import err, new_table, out, print_json
from floom.config import Settings, mask_password
from floom.errors import quoted
from floom.services.context import Context
from floom.services.ops.backup import create_backup, restore_backup
from floom.services.ops.held_logs import (
    HeldBackOutcome,
    all_held_back,
    give_up_held_logs,
    retry_held_logs,
)
from floom.services.ops.objects import check_blobs, migrate_blobs
from floom.services.ops.retention import apply_retention, compact_store
from floom.services.ops.store_copy import copy_store

retention_app = typer.Typer(help="Delete old runs' logs and artifacts (FLOOM_RETENTION_DAYS).")
blobs_app = typer.Typer(
    help="Move blobs between the database and object storage, check every one, and see to "
    "held-back run logs."
)


def register(app: typer.Typer) -> None:
    """Add the operator commands to the floom command."""
    app.command("backup")(backup)
    app.command("restore")(restore)
    app.command("migrate-store")(migrate_store)
    app.add_typer(retention_app, name="retention", no_args_is_help=True)
    app.add_typer(blobs_app, name="blobs", no_args_is_help=True)


def _counts_table(counts: dict[str, int]) -> Any:
    table = new_table("TABLE", "ROWS")
    for name, n in counts.items():
        table.add_row(name, str(n))
    return table


def backup(
    dest: Annotated[Path, typer.Argument(help="a new directory to write the backup into")],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Back up this node's SQLite database and data dir while floom keeps serving."""

    summary = create_backup(settings=Settings(), dest=dest)
    if as_json:
        print_json(summary.to_dict())
        return
    out.print(Text(f"backup written to {summary.path} (schema {summary.schema_revision})"))
    out.print(_counts_table(summary.counts))
    for warning in summary.warnings:
        err.print(Text(f"warning: {warning}", style="yellow"))


def restore(
    source: Annotated[Path, typer.Argument(help="a directory written by `floom backup`")],
    force: Annotated[
        bool,
        typer.Option("--force", help="replace the database and files of a non-empty data dir"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Restore a backup into this node's data dir (FLOOM_DATA_DIR), which must be empty."""

    summary = restore_backup(settings=Settings(), source=source, force=force)
    if as_json:
        print_json(summary.to_dict())
        return
    out.print(Text(f"restored into {summary.path} (schema {summary.schema_revision})"))
    out.print(_counts_table(summary.counts))
    for warning in summary.warnings:
        err.print(Text(f"warning: {warning}", style="yellow"))


def migrate_store(
    to: Annotated[
        str,
        typer.Option("--to", help="the new, empty database, e.g. postgresql+psycopg://u:p@h/floom"),
    ],
    source: Annotated[
        str | None,
        typer.Option("--from", help="the database to copy (default: this node's store)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Copy this node's whole store into an empty PostgreSQL database (stop floom first)."""

    settings = Settings()
    source_url = source or settings.resolved_database_url
    err.print(Text(f"copying {mask_password(source_url)} -> {mask_password(to)}"))
    result = copy_store(source_url=source_url, target_url=to)
    if as_json:
        print_json(result.to_dict())
        return
    out.print(_counts_table(result.counts))
    out.print(
        Text(
            "done: start floom with FLOOM_DATABASE_URL set to the new database and the same "
            "secret key (FLOOM_SECRET_KEY, or this data dir's secret.key), or the stored "
            "secrets cannot be read"
        )
    )


@retention_app.command("run")
def retention_run(
    days: Annotated[
        int | None,
        typer.Option("--days", min=1, help="override FLOOM_RETENTION_DAYS for this pass"),
    ] = None,
    alert_days: Annotated[
        int | None,
        typer.Option(
            "--alert-days", min=1, help="override FLOOM_ALERT_RETENTION_DAYS for this pass"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Delete old runs' logs and artifacts and old alert history now; reclaim unused blobs."""

    ctx = Context.open(Settings())
    try:
        report = apply_retention(ctx, days=days, alert_days=alert_days)
    finally:
        ctx.engine.dispose()
    if as_json:
        print_json(report.to_dict())
        return
    out.print(
        Text(
            f"pruned {report.runs_pruned} run(s): {report.log_lines_deleted} log line(s), "
            f"{report.artifacts_deleted} artifact(s); {report.blobs_deleted} blob(s) reclaimed, "
            f"{report.objects_deleted} unreferenced object(s) deleted from the bucket; "
            f"alert history: {report.alert_events_deleted} event(s), "
            f"{report.alert_incidents_deleted} incident(s), "
            f"{report.alert_deliveries_deleted} delivery record(s); "
            f"{report.webhook_deliveries_deleted} webhook delivery(ies), "
            f"{report.delivery_tombstones_deleted} delivery tombstone(s)"
            + (
                f"; {report.pages_freed} free page(s) given back to the disk"
                if report.pages_freed
                else ""
            )
        )
    )


@retention_app.command("compact")
def retention_compact(
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Give a SQLite database's free pages back to the disk now. A file made by an older floom
    is rebuilt once with VACUUM (stop floom first; needs free disk the size of the database)."""

    ctx = Context.open(Settings())
    try:
        pages = compact_store(ctx)
    finally:
        ctx.engine.dispose()
    if as_json:
        print_json({"pages_freed": pages})
        return
    out.print(Text(f"{pages} free page(s) given back to the disk"))


@blobs_app.command("migrate")
def blobs_migrate(
    to: Annotated[
        str,
        typer.Option("--to", help="where the blobs go: s3 (FLOOM_S3_*) or database"),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Move every version archive, artifact, workspace and ended run's log to `--to`.

    Each blob is read back checked against its sha256 and moved in a transaction of its own:
    floom may keep serving, a stopped migration is finished by running it again, and a
    second run moves nothing. A blob missing or damaged where it is stays there; the others
    move, and the command names it (and what uses it) at the end and exits 1."""

    ctx = Context.open(Settings())
    try:
        result = migrate_blobs(ctx, to=to, progress=None if as_json else _progress)
    finally:
        ctx.engine.dispose()
    if as_json:
        print_json(result.to_dict())
    else:
        out.print(
            Text(
                f"{result.moved} blob(s) moved to {result.to} ({result.bytes_moved} bytes), "
                f"{result.already} there already; {result.logs_archived} ended run log(s) moved"
            )
        )
        for warning in result.warnings:
            err.print(Text(f"warning: {warning}", style="yellow"))
        for skipped in result.skipped:
            err.print(
                Text(f"not moved: blob {skipped.digest} ({skipped.location}): {skipped.problem}")
            )
    if result.skipped:
        err.print(
            Text(
                f"{len(result.skipped)} blob(s) were not moved (listed above, or `skipped` in "
                "--json): restore their bytes (from a backup) or delete what uses them, then "
                "run the migration again; `floom blobs check` lists every damaged blob",
                style="red",
            )
        )
        raise typer.Exit(1)


@blobs_app.command("check")
def blobs_check(
    as_json: Annotated[bool, typer.Option("--json", help="print the problems as JSON")] = False,
) -> None:
    """Read every blob back and check its sha256; exit 1 when one is missing or damaged."""

    ctx = Context.open(Settings())
    try:
        checked, problems = check_blobs(ctx, progress=None if as_json else _progress)
    finally:
        ctx.engine.dispose()
    if as_json:
        print_json({"checked": checked, "problems": [p.__dict__ for p in problems]})
    else:
        table = new_table("BLOB", "WHERE", "PROBLEM")
        for p in problems:
            table.add_row(p.digest[:16], p.location, p.problem)
        if problems:
            out.print(table)
        out.print(Text(f"{checked} blob(s) checked, {len(problems)} problem(s)"))
    if problems:
        raise typer.Exit(1)


@blobs_app.command("held-back")
def blobs_held_back(
    retry: Annotated[
        bool, typer.Option("--retry", help="try to move each one now (a restored object)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print them as JSON")] = False,
) -> None:
    """List the ended runs whose logs are held back: their later lines wait in the database
    because their earlier log object is missing or damaged. Exit 1 while any is.

    Restore the object (a backup, the bucket's versioning) and the next upkeep sweep moves
    the log, or `--retry` now; or give the lost lines up with `floom blobs give-up`."""

    ctx = Context.open(Settings())
    try:
        if retry:
            _said(retry_held_logs(ctx), as_json=as_json, verb="moved")
        held = all_held_back(ctx.engine)
    finally:
        ctx.engine.dispose()
    if as_json and not retry:
        print_json({"held_back": [h.to_dict() for h in held]})
    elif not as_json:
        table = new_table("RUN", "WORKER", "LOST LINES", "PROBLEM")
        for h in held:
            table.add_row(h.run_id, h.worker, f"1-{h.last_seq}", h.problem)
        if held:
            out.print(table)
        out.print(Text(f"{len(held)} run log(s) held back"))
    if held:
        raise typer.Exit(1)


@blobs_app.command("give-up")
def blobs_give_up(
    runs: Annotated[
        list[str] | None, typer.Argument(help="the runs whose held-back logs to give up")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="give up every held-back run log")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
) -> None:
    """Give up the missing or damaged earlier log of held-back runs: a line saying which
    lines were lost takes its place, and the later lines become the run's log, moved to the
    bucket. Each is retried first: one whose object is back just moves. Cannot be undone."""

    if bool(runs) == every:
        err.print(Text("name the runs to give up, or --all (not both)", style="red"))
        raise typer.Exit(2)
    ctx = Context.open(Settings())
    try:
        outcome = give_up_held_logs(ctx, run_ids=None if every else runs)
    finally:
        ctx.engine.dispose()
    _said(outcome, as_json=as_json, verb="given up")
    if outcome.not_held and not every:
        raise typer.Exit(1)


def _said(outcome: HeldBackOutcome, *, as_json: bool, verb: str) -> None:
    if as_json:
        print_json(outcome.to_dict())
        return
    for run_id in outcome.moved:
        out.print(Text(f"run {run_id}: its earlier log is readable again; the log moved"))
    for run_id in outcome.given_up:
        out.print(Text(f"run {run_id}: lost lines given up; the later lines are its log"))
    for run_id, problem in outcome.held.items():
        err.print(Text(f"run {run_id}: still held back: {problem.problem}"))
    for run_id in outcome.not_held:  # as the operator typed it: cut, and shown as text
        err.print(Text(f"run {quoted(run_id)}: its log is not held back (nothing done)"))
    done = len(outcome.given_up) if verb == "given up" else len(outcome.moved)
    out.print(Text(f"{done} run log(s) {verb}"))


def _progress(line: str) -> None:
    err.print(Text(line, style="dim"))
