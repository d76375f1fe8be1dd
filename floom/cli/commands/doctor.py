"""`floom doctor`: checks what this node needs and prints each check with its fix."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from floom.cli.output import out, print_json
from floom.config import Settings
from floom.hints import cli as cli_hints
from floom.services.ops.doctor import FAIL, OK, WARN, run_checks

_MARKS = {OK: ("ok  ", "green"), WARN: ("warn", "yellow"), FAIL: ("FAIL", "red")}


def register(app: typer.Typer) -> None:
    """Add `floom doctor` to the floom command."""
    app.command("doctor")(doctor)


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Check this node: sandbox, database, secret key, disk; exit 1 when something fails."""
    checks = run_checks(Settings())
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        print_json([c.to_dict() for c in checks])
    else:
        for c in checks:
            mark, style = _MARKS[c.status]
            out.print(Text(f"{mark} {c.name}: {c.detail}", style=style if c.status != OK else ""))
            if c.fix and c.status != OK:
                out.print(Text(f"     fix: {cli_hints.written(c.fix)}"))
    if failed:
        raise typer.Exit(1)
