"""How the floom command prints: its answer and note lines, tables and error lines; the
consoles, run records and log lines come from console.py (rich without typer)."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from floom.cli.console import (
    duration,
    err,
    human_size,
    log_line,
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

__all__ = [
    "duration",
    "err",
    "fail",
    "human_size",
    "log_line",
    "new_table",
    "note",
    "out",
    "print_json",
    "print_outcome",
    "print_result",
    "run_heading",
    "say",
    "status_text",
    "took",
    "value_text",
    "when",
]


def say(message: str, *, style: str = "") -> None:
    """A line of the command's answer, on stdout."""
    out.print(Text(message, style=style))


def note(message: str, *, style: str = "") -> None:
    """A line for the person at the terminal, on stderr, so stdout stays parseable."""
    err.print(Text(message, style=style))


def fail(message: str, hint: str | None = None, details: Any = None) -> NoReturn:
    """Print an error (its problems, its hint) on stderr and exit 1."""
    err.print(Text(f"error: {message}", style="red"))
    for line in _detail_lines(message, details):
        err.print(Text(line))
    if hint:
        err.print(Text(f"hint: {hint}", style="yellow"))
    raise typer.Exit(1)


def _detail_lines(message: str, details: Any) -> list[str]:
    """Problem lines from an error's details, unless the message already names them all."""
    if not isinstance(details, list):
        return []
    if all(isinstance(d, dict) and str(d.get("message")) in message for d in details):
        return []
    lines = []
    for item in details:
        if isinstance(item, dict) and "message" in item:
            where = f"{item['path']}: " if item.get("path") else ""
            hint = f" (hint: {item['hint']})" if item.get("hint") else ""
            lines.append(f"  {where}{item['message']}{hint}")
    return lines


def new_table(*columns: str) -> Table:
    """A borderless table whose cells never wrap, so ids stay whole for copy and paste."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table
