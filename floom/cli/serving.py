"""`floom serve`'s work without typer: reading its command line and starting the server.

A server runs for days and holds whatever its start-up loaded: typer and the command's
module cost about 1.3 MiB resident that serving never uses. `floom serve` with its own
options only (`--host`, `--port`, `--roles`, `--database-url`, `--sandbox`, as `--opt VALUE`
or `--opt=VALUE`) is read here and started without typer; anything else (help, an unknown
option, a port that is not a number) goes to the typer command in serve.py, which starts
the server the same way, so behaviour is the typer command's by construction.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from floom.config import Settings, mask_password

# The typer command's options, each a setting of the same name (serve.py).
OPTIONS = {
    "--host": "host",
    "--port": "port",
    "--roles": "roles",
    "--database-url": "database_url",
    "--sandbox": "sandbox",
}


def parse(args: list[str]) -> dict[str, Any] | None:
    """The settings `floom serve ARGS` gives, or None when the typer command should read it."""
    given: dict[str, Any] = {}
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        i += 1
        if name not in OPTIONS:
            return None
        if not sep:
            if i == len(args):
                return None
            value = args[i]
            i += 1
        given[OPTIONS[name]] = value  # a repeated option: the last wins, as in typer
    if "port" in given:
        try:
            given["port"] = int(given["port"])
        except ValueError:
            return None
    return given


def run(args: list[str]) -> None:
    """Serve when this path can read `floom serve ARGS`; return (serving nothing) otherwise."""
    overrides = parse(args)
    if overrides is None:
        return
    try:
        serve(overrides)
    except Exception as exc:  # the command's outermost boundary, as the typer app's
        # Imported here: typer and rich only for an error line.
        from floom.cli.command import exit_on_error

        exit_on_error(exc)
    sys.exit(0)


def serve(overrides: dict[str, Any]) -> None:
    """Run the server with these settings over the environment's: API, scheduler and
    executor as its roles say, until it is stopped."""
    # Settings are checked before the server is loaded: a mistyped one is refused at once.
    settings = Settings(**overrides)

    # Imported here, not at the top: the server app costs ~0.75 s, which `floom serve --help`
    # (and a refused setting) need not pay.
    import uvicorn

    from floom.api.app import create_app
    from floom.api.draining import DrainingServer
    from floom.api.edge.connections import guarded_protocol
    from floom.node import preflight
    from floom.sandbox import backend_readiness, get_sandbox
    from floom.sandbox.base import describe_protections

    url = settings.public_url or f"http://{settings.host}:{settings.port}"
    _say(
        f"floom on {url}  data dir {settings.data_dir}  "
        f"database {mask_password(settings.resolved_database_url)}  "
        f"roles {settings.roles}"
    )
    # A FloomError here (a store or sandbox that cannot serve) ends the command with its
    # error and hint lines, as any command's (command.exit_on_error).
    ctx = preflight(settings)
    if "executor" in settings.role_set:
        protections = get_sandbox(settings.sandbox, settings).protections()
        _say(f"sandbox {settings.sandbox}: {describe_protections(protections)}")
        ready = backend_readiness(settings)
        _say("sandboxes: " + "; ".join(f"{n} {state}" for n, state in ready.items()))
    # httptools: uvicorn's C parser, about 0.5 ms less CPU per request than its pure-Python
    # h11 (bench/README.md), in a protocol that bounds each connection's headers and the
    # connections held (floom/api/edge/connections.py). asyncio's own loop, named: uvicorn
    # would take uvloop wherever it happens to be installed, which saves about 0.2 ms of CPU
    # per run and holds 2.4 MiB more at idle (bench/README.md), so the node would change
    # with its neighbours' packages.
    app = create_app(ctx=ctx)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=settings.access_log,
        http=guarded_protocol(settings),
        loop="asyncio",
        # floom reads forwarding headers itself, from FLOOM_FORWARDED_ALLOW_IPS only
        # (floom/api/forwarded.py): uvicorn's own reading would trust its defaults too.
        proxy_headers=False,
    )
    # The API answers 503 with Retry-After while the executor drains (api/draining.py).
    DrainingServer(config, app=app, on_started=settle_heap).run()


def settle_heap() -> None:
    """Leave what start-up made out of the cyclic garbage collector's passes: its oldest
    generation held some 170,000 objects (the app, its models, SQLAlchemy's tables), and
    each full pass over them took about 0.1 s of CPU with the GIL held, every few hundred
    runs (bench/README.md). What start-up made stays for the process's life anyway."""
    gc.collect()
    gc.freeze()


def _say(line: str) -> None:
    # Plain lines, as rich would print them unstyled: the server process need not hold rich
    # (about 1.3 MiB resident) for three lines.
    print(line, flush=True)
