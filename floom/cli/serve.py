"""`floom serve`: run the server (API, scheduler and executor) in this process."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from floom.cli.output import fail, out
from floom.config import Settings, mask_password
from floom.errors import FloomError


def register(app: typer.Typer) -> None:
    """Add `floom serve` to the floom command."""
    app.command()(serve)


def serve(
    host: Annotated[str | None, typer.Option(help="address to bind (FLOOM_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (FLOOM_PORT)")] = None,
) -> None:
    """Run the floom server: API, scheduler and executor in one process."""
    # Imported here, not at the top: the server app costs ~0.75 s, which `floom serve --help`
    # need not pay.
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
