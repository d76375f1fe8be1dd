"""`floom serve`: run the server (API, scheduler and executor) in this process."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from floom.config import Settings, mask_password
from floom.errors import FloomError


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
    # Settings are checked before the server is loaded: a mistyped one is refused at once.
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    settings = Settings(**overrides)

    # Imported here, not at the top: the server app costs ~0.75 s, which `floom serve --help`
    # (and a refused setting) need not pay.
    import uvicorn

    from floom.api.app import create_app, preflight
    from floom.sandbox import backend_readiness, get_sandbox
    from floom.sandbox.base import describe_protections

    url = settings.public_url or f"http://{settings.host}:{settings.port}"
    _say(
        f"floom on {url}  data dir {settings.data_dir}  "
        f"database {mask_password(settings.resolved_database_url)}  "
        f"roles {settings.roles}"
    )
    try:
        ctx = preflight(settings)
    except FloomError as exc:
        from floom.cli.output import fail  # noqa: PLC0415 - rich only for the error

        fail(exc.message, exc.hint)
    if "executor" in settings.role_set:
        protections = get_sandbox(settings.sandbox, settings).protections()
        _say(f"sandbox {settings.sandbox}: {describe_protections(protections)}")
        ready = backend_readiness(settings)
        _say("sandboxes: " + "; ".join(f"{n} {state}" for n, state in ready.items()))
    uvicorn.run(create_app(ctx=ctx), host=settings.host, port=settings.port, log_level="info")


def _say(line: str) -> None:
    # Plain lines, as rich would print them unstyled: the server process need not hold rich
    # (about 1.3 MiB resident) for three lines.
    print(line, flush=True)
