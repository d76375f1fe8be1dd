"""FLOOM_ROLES is checked at start and every role is honoured; `floom serve` takes the
settings that matter as flags, with the environment variables still working."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from floom.config import Settings
from floom.errors import StoreNewerThanNode
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.store.db import session_scope
from floom.store.nodes import Node
from tests.support.harness import (
    EXAMPLES,
    deploy_folder,
    fast_settings,
    live_server,
    wait_for_run,
    wait_until,
)
from tests.support.processes.server_process import ServerProcess


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    base.update(FLOOM_DATA_DIR=str(tmp_path / "data"), FLOOM_DEPLOY_EXAMPLES="false", **env)
    return subprocess.run(
        [sys.executable, "-m", "floom.cli", "serve", "--port", "1", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unknown_role_stops_start_up_with_an_error_naming_it_and_the_known_roles(
    tmp_path: Path,
) -> None:
    by_flag = serve(tmp_path, "--roles", "api,executer")
    by_env = serve(tmp_path, FLOOM_ROLES="schedular")
    for result, bad in ((by_flag, "executer"), (by_env, "schedular")):
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert "FLOOM_ROLES" in result.stderr
        assert f"unknown role '{bad}'" in result.stderr
        assert "api, scheduler, executor" in result.stderr
    with pytest.raises(ValidationError):
        Settings(roles=" , ")
    assert Settings(roles="executor, api").roles == "api,executor"


def test_serve_takes_the_database_url_and_sandbox_as_flags_over_the_environment(
    tmp_path: Path,
) -> None:
    unreachable = "postgresql+psycopg://floom:pw@127.0.0.1:1/nowhere"
    result = serve(
        tmp_path, "--database-url", unreachable, FLOOM_DATABASE_URL="sqlite:///unused.db"
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "postgresql+psycopg://floom:***@127.0.0.1:1/nowhere" in result.stdout + result.stderr
    assert "pw@" not in result.stdout + result.stderr

    sandbox = serve(tmp_path, "--sandbox", "nosuch", "--roles", "executor")
    assert sandbox.returncode == 1
    assert "unknown sandbox 'nosuch'" in sandbox.stderr


def test_a_node_without_the_api_role_answers_only_healthz(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'floom.db'}"
    with live_server(tmp_path / "exec", url, roles="executor") as node, node.client() as c:
        health = c.get("/healthz")
        assert health.status_code == 200
        assert health.json()["roles"] == ["executor"]
        assert health.json()["executor"]["slots"] >= 1
        for path in ("/api/v1/workers", "/api/v1/nodes", "/", "/mcp", "/docs/../api/v1/runs"):
            assert c.get(path).status_code == 404, path
        assert c.post("/api/v1/workers/hello/runs", json={}).status_code == 404
        assert c.get("/metrics").status_code == 200  # monitoring stays


def test_only_a_node_with_the_executor_role_claims_runs_and_only_a_scheduler_node_fires(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'floom.db'}"
    with live_server(tmp_path / "api", url, roles="api") as api_node, api_node.client() as c:
        # Neither the claim loop nor the schedule thread runs on this node.
        names = {t.name for t in threading.enumerate()}
        assert "floom-dispatch" not in names
        assert "floom-scheduler" not in names
        deploy_folder(c, EXAMPLES / "hello")
        run_id = c.post("/api/v1/workers/hello/runs", json={"inputs": {}}).json()["id"]
        # Three heartbeats of the api node: ample time for a claim had it an executor.
        with session_scope(api_node.ctx.engine) as s:
            first = s.get(Node, api_node.ctx.node_id)
            assert first is not None
            assert first.slots is None
            seen = first.heartbeat_at

        def beats() -> bool:
            with session_scope(api_node.ctx.engine) as s:
                row = s.get(Node, api_node.ctx.node_id)
                return row is not None and (row.heartbeat_at - seen).total_seconds() > 0.5

        wait_until(beats, timeout=20)
        assert runs.get_run(api_node.ctx, caller=SYSTEM, run_id=run_id).status == "queued"
        with live_server(tmp_path / "exec", url, roles="executor") as executor_node:
            done = wait_for_run(c, run_id)
            logs = "\n".join(
                e["line"] for e in c.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
            )
            assert done["status"] == "succeeded", (done, logs)
            assert executor_node.ctx.node_id in logs
            assert api_node.ctx.node_id != executor_node.ctx.node_id
    with live_server(tmp_path / "sched", url, roles="scheduler"):
        assert "floom-scheduler" in {t.name for t in threading.enumerate()}


def test_a_node_older_than_the_database_schema_refuses_to_start_naming_the_revision(
    tmp_path: Path,
) -> None:
    settings = fast_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}")
    Context.open(settings).engine.dispose()
    engine = create_engine(settings.resolved_database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    engine.dispose()
    with pytest.raises(StoreNewerThanNode, match="revision 0999") as refused:
        Context.open(settings)
    assert refused.value.code == "store_newer_than_node"
    assert "upgrade this node" in str(refused.value.hint)


@pytest.mark.parametrize("access_log", ["", "true"], ids=["default", "on"])
def test_serve_prints_a_line_per_request_only_when_the_access_log_is_on(
    tmp_path: Path, access_log: str
) -> None:
    env = {"FLOOM_ROLES": "api"} | ({"FLOOM_ACCESS_LOG": access_log} if access_log else {})
    server = ServerProcess(
        tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}", keep_stdout=True, **env
    )
    server.start()
    try:
        with server.client() as c:
            assert c.get("/api/v1/workers", params={"limit": 7}).status_code == 200
    finally:
        server.stop()
    logged = [line for line in server.log().splitlines() if "/api/v1/workers" in line]
    if access_log:
        assert len(logged) == 1
        assert '"GET /api/v1/workers?limit=7 HTTP/1.1" 200' in logged[0]
    else:
        assert logged == [], logged
