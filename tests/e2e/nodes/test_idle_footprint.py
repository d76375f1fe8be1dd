"""A floom server started by `floom serve`, idle with the examples deployed, on SQLite and on
PostgreSQL, has not loaded what only some uses need (ONLY_SOME_USES_NEED: Alembic, psycopg and
SQLAlchemy's PostgreSQL dialect on SQLite, cryptography, httpx, the agent package and the
model provider's SDK, the MCP and E2B SDKs, rich, typer, prometheus-client, the web UI with
jinja2): each stays out of its resident memory until a database is behind, PostgreSQL is
used, a secret is read, an agent runs, /mcp is reached, E2B is the sandbox, an error is
printed or another command runs, /metrics is scraped or a page of the UI is asked for; and
the app serves its routers' routes as they were built, not a second build of each (FastAPI's
include_router: about 5 MiB resident from the first request on)."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

from fastapi import APIRouter

import floom.api
import floom.ui
from floom.api.app import create_app
from floom.config import Settings
from floom.ui import app as ui
from tests.support.harness import free_port

# What only some uses need; each module (and anything under it) must stay out of an idle
# server's sys.modules. On PostgreSQL psycopg and SQLAlchemy's PostgreSQL dialect are in use.
ONLY_SOME_USES_NEED = (
    "alembic",  # migrations, when the database is behind
    "psycopg",  # PostgreSQL
    "sqlalchemy.dialects.postgresql",
    "cryptography",  # a secret read or written
    "httpx",  # an agent's provider calls, the CLI
    "anthropic",  # an agent run
    "mcp",  # the first request to /mcp
    "e2b",  # a node running scripts in E2B
    "floom.agent",
    "floom.mcp",
    "floom.sandbox.e2b.backend",
    "rich",  # the CLI's printing
    "pygments",
    "typer",  # the CLI's other commands: `floom serve` starts without it (cli/serving.py)
    "prometheus_client",  # the first scrape of /metrics
    "jinja2",  # the web UI's first page
    "floom.ui.app",
    "floom.ui.support",
)
POSTGRES_ONLY = ("psycopg", "sqlalchemy.dialects.postgresql")

# `floom serve --port P` as the command runs it (floom.cli.index.main in the main thread);
# a watcher thread reads sys.modules once /healthz answers, asks for a UI page, then stops
# the server as Ctrl-C would.
PROBE = """
import gc, os, signal, sys, threading, time, urllib.request

port = int(os.environ["FLOOM_PORT"])
watched = tuple(sys.argv[1].split(","))


def watch():
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            print("NO HEALTHZ", flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.05)
    loaded = {w for w in watched for m in list(sys.modules) if m == w or m.startswith(w + ".")}
    print("LOADED", sorted(loaded), flush=True)
    print("HTTP", "uvicorn.protocols.http.httptools_impl" in sys.modules, flush=True)
    print("FROZEN", gc.get_freeze_count() > 10000, flush=True)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=30) as answer:
        print("UI", answer.status, "jinja2" in sys.modules, flush=True)
    os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=watch, daemon=True).start()
sys.argv = ["floom", "serve", "--port", str(port)]
from floom.cli.index import main

main()
"""


def test_an_idle_server_has_not_loaded_what_only_some_uses_need(
    tmp_path: Path, database_url: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env.update(
        FLOOM_DATA_DIR=str(tmp_path / "data"),
        FLOOM_DATABASE_URL=database_url,
        FLOOM_DEPLOY_EXAMPLES="true",
        FLOOM_SECRET_KEY="test-secret-key",
        FLOOM_HOST="127.0.0.1",
        FLOOM_PORT=str(free_port()),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(ONLY_SOME_USES_NEED)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    in_use = POSTGRES_ONLY if database_url.startswith("postgresql") else ()
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert len(lines) == 1, done.stdout + done.stderr
    loaded = [m for m in ast.literal_eval(lines[0].removeprefix("LOADED ")) if m not in in_use]
    assert loaded == [], done.stdout + done.stderr
    # uvicorn's C parser (httptools), not its pure-Python one (h11): about 0.5 ms less CPU
    # per request (bench/README.md).
    assert "\nHTTP True\n" in done.stdout, done.stdout + done.stderr
    # What start-up made is out of the garbage collector's full passes (cli/serving.py).
    assert "\nFROZEN True\n" in done.stdout, done.stdout + done.stderr
    assert "\nUI 200 True\n" in done.stdout, done.stdout + done.stderr  # the first page loads it
    assert done.returncode == 0, done.stdout + done.stderr  # stopped as by Ctrl-C


def test_the_app_serves_its_routers_routes_as_built_not_a_second_build_of_each(
    tmp_path: Path,
) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", secret_key="test-secret-key"))
    ui.install(app)  # what the first page asked for does
    served = {id(route) for route in app.routes}
    # Every router floom's API package defines, found rather than listed: a new one is
    # checked too.
    modules = [
        importlib.import_module(info.name)
        for package in (floom.api, floom.ui)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    ]
    routed = [m for m in modules if isinstance(getattr(m, "router", None), APIRouter)]
    assert len(routed) >= 20, [m.__name__ for m in routed]  # the API's and the UI's
    for module in routed:
        assert module.router.routes, module.__name__
        built_again = [r for r in module.router.routes if id(r) not in served]
        assert not built_again, f"{module.__name__}: {built_again}"
