"""A started floom server on SQLite, idle with the examples deployed, has not loaded what only
some uses need (Alembic, psycopg and SQLAlchemy's PostgreSQL dialect, cryptography, httpx,
rich, prometheus-client, the agent package, the web UI with jinja2): each stays out of its
resident memory until a database is behind, PostgreSQL is used, a secret is read, an agent
runs, /metrics is scraped, an error is printed or a page of the UI is asked for; and the app
serves its routers' routes as they were built, not a second build of each (FastAPI's
include_router: about 5 MiB resident from the first request on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from floom.api import (
    metrics,
    routes_admin,
    routes_agents,
    routes_approvals,
    routes_audit,
    routes_handoffs,
    routes_hooks,
    routes_nodes,
    routes_replays,
    routes_runs,
    routes_triggers,
    routes_workers,
    ui,
    ui_admin,
    ui_approvals,
    ui_handoffs,
    ui_nodes,
    ui_ops,
    ui_replays,
    ui_runs,
)
from floom.api.app import create_app
from floom.config import Settings
from tests.conftest import free_port

PROBE = """
import sys, threading, time, urllib.request
import uvicorn
import floom.cli.command, floom.cli.serve
from floom.api.app import create_app
from floom.config import Settings

data_dir, port = sys.argv[1], int(sys.argv[2])
settings = Settings(data_dir=data_dir, deploy_examples=True, secret_key="test-secret-key")
config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
server = uvicorn.Server(config)
thread = threading.Thread(target=server.run, daemon=True)
thread.start()
deadline = time.monotonic() + 60
while not server.started and time.monotonic() < deadline:
    time.sleep(0.05)
with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
    assert answer.status == 200
loaded = sorted(
    {m.split(".")[0] for m in sys.modules}
    & {"alembic", "psycopg", "cryptography", "httpx", "rich", "pygments", "prometheus_client",
       "jinja2"}
    | {m for m in sys.modules if m.startswith(("floom.agent", "sqlalchemy.dialects.postgresql"))}
    | {m for m in sys.modules if m in ("floom.api.ui", "floom.api.ui_support")}
)
print("LOADED", loaded)
with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=30) as answer:
    print("UI", answer.status, "jinja2" in sys.modules)
server.should_exit = True
thread.join(30)
"""


def test_an_idle_server_has_not_loaded_what_only_some_uses_need(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "data"), str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert lines == ["LOADED []"], done.stdout + done.stderr
    assert "\nUI 200 True\n" in done.stdout, done.stdout + done.stderr  # the first page loads it


def test_the_app_serves_its_routers_routes_as_built_not_a_second_build_of_each(
    tmp_path: Path,
) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", secret_key="test-secret-key"))
    ui.install(app)  # what the first page asked for does
    served = {id(route) for route in app.routes}
    for module in (
        metrics,
        routes_admin,
        routes_agents,
        routes_approvals,
        routes_audit,
        routes_handoffs,
        routes_hooks,
        routes_nodes,
        routes_replays,
        routes_runs,
        routes_triggers,
        routes_workers,
        ui,
        ui_admin,
        ui_approvals,
        ui_handoffs,
        ui_nodes,
        ui_ops,
        ui_replays,
        ui_runs,
    ):
        assert module.router.routes, module.__name__
        built_again = [r for r in module.router.routes if id(r) not in served]
        assert not built_again, f"{module.__name__}: {built_again}"
