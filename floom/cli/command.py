"""The floom command: the typer app with every command group registered, `serve`, which runs
the server, and the entry point that turns errors into "error:" and "hint:" lines."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.text import Text

from floom.cli import admin, agents, approvals, handoffs, mcp, runs, triggers, workers
from floom.cli.output import fail, out
from floom.config import Settings, mask_password
from floom.errors import FloomError

app = typer.Typer(
    name="floom",
    help="Deploy, run and inspect background AI workers on a floom server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def serve(
    host: Annotated[str | None, typer.Option(help="address to bind (FLOOM_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (FLOOM_PORT)")] = None,
) -> None:
    """Run the floom server: API, scheduler and executor in one process."""
    # Imported here, not at the top: the server app costs ~0.75 s of every CLI start-up.
    import uvicorn

    from floom.api.app import create_app, preflight
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
        fail(exc.message, exc.hint)
    if "executor" in settings.role_set:
        protections = get_sandbox(settings.sandbox, settings).protections()
        out.print(Text(f"sandbox {settings.sandbox}: {describe_protections(protections)}"))
    uvicorn.run(create_app(ctx=ctx), host=settings.host, port=settings.port, log_level="info")


# The order here is the order of `floom --help` (commands first, then groups).
app.command()(serve)
workers.register(app)
runs.register(app)
admin.register(app)
mcp.register(app)
agents.register(app)
handoffs.register(app)
approvals.register(app)
triggers.register(app)
workers.register_group(app)


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
        fail(message, hint, details)
    except typer.Exit as done:
        sys.exit(done.exit_code)
