"""`floom serve`: run the server (API, scheduler and executor) in this process. The work is
serving.py's, which also serves the plain command lines without typer."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from floom.cli import serving


def register(app: typer.Typer) -> None:
    """Add `floom serve` to the floom command."""
    app.command()(serve)


def serve(
    host: Annotated[str | None, typer.Option(help="address to bind (FLOOM_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (FLOOM_PORT)")] = None,
    roles: Annotated[
        str | None,
        typer.Option(help="what this node does: api, scheduler, executor (FLOOM_ROLES)"),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(help="the store; PostgreSQL to share it between nodes (FLOOM_DATABASE_URL)"),
    ] = None,
    sandbox: Annotated[
        str | None, typer.Option(help="where script workers run (FLOOM_SANDBOX)")
    ] = None,
) -> None:
    """Run the floom server: API, scheduler and executor in one process."""
    given = {
        "host": host,
        "port": port,
        "roles": roles,
        "database_url": database_url,
        "sandbox": sandbox,
    }
    # A flag wins over its environment variable; an unset flag leaves the variable in force.
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    serving.serve(overrides)
