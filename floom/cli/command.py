"""The floom command as a typer app whose commands load on demand: a command line imports only
the module of the command it names (floom/cli/index.py lists them), and the entry point turns
errors into "error:" and "hint:" lines."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from floom.cli.index import COMMANDS, help_text
from floom.errors import FloomError


class LazyCommands(TyperGroup):
    """The top-level group: names come from the index; a command is built from its module
    the first time it is asked for. (Contexts and commands are typed Any: typer's own
    classes live in its private vendored copy of click.)"""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(f"floom.cli.{entry.module}")
        holder = typer.Typer(add_completion=False)
        getattr(module, entry.register)(holder)
        return typer.main.get_group(holder).commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # The index's text, so that the top-level help never loads every command module.
        formatter.write(help_text())


app = typer.Typer(
    name="floom",
    cls=LazyCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def floom() -> None:
    """Deploy, run and inspect background AI workers on a floom server."""


def main() -> None:
    """Entry point: floom's errors become "error:" and "hint:" lines and exit code 1."""
    guarded(app)


def guarded(call: Callable[[], Any]) -> None:
    """Call `call` as the floom command runs its commands: a typer.Exit ends the process with
    its code, and any other failure ends it as `exit_on_error` says."""
    try:
        call()
    except typer.Exit as done:  # raised by a command run outside the typer app
        sys.exit(done.exit_code)
    except Exception as exc:  # the outermost boundary: a bug should still not dump a trace
        exit_on_error(exc)


def exit_on_error(exc: Exception) -> NoReturn:
    """End the command for a failure: floom's errors become "error:" and "hint:" lines and
    exit code 1, and so does a bug, as an "unexpected" line (raised again with FLOOM_DEBUG)."""
    if isinstance(exc, FloomError):
        _exit_with(exc.message, exc.hint, exc.details)
    # A settings error comes from pydantic, loaded only by the commands that read them, and
    # so does a request the options make that its model refuses (a value over its length).
    pydantic_core = sys.modules.get("pydantic_core")
    if pydantic_core is not None and isinstance(exc, pydantic_core.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        if exc.title != "Settings":  # a request model (floom.schemas) built from the options
            _exit_with(f"invalid {where}: {first.get('msg')}", "see the command's --help")
        # A rule over several settings (a model validator) has no one name: its message
        # names them.
        named = f"setting FLOOM_{where.upper()}" if where else "settings"
        message = str(first.get("msg")).removeprefix("Value error, ")
        _exit_with(f"invalid {named}: {message}", "check the FLOOM_* environment variables")
    if os.environ.get("FLOOM_DEBUG"):
        raise exc
    _exit_with(
        f"unexpected {type(exc).__name__}: {exc}",
        "this is a bug in floom; rerun with FLOOM_DEBUG=1 for the traceback",
    )


def _exit_with(message: str, hint: str | None, details: Any = None) -> NoReturn:
    # Imported here, not at the top: rich is for the error lines, which `floom serve`'s
    # process, running for days, need not hold.
    from floom.cli.output import fail

    try:
        fail(message, hint, details)
    except typer.Exit as done:
        sys.exit(done.exit_code)
