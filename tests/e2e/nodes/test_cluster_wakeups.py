"""Nodes on one PostgreSQL hear each other at once: queued runs, cancels, revoked keys."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from floom.store.signals import APPLICATION_NAME
from tests.support.harness import (
    PG_ADMIN_URL,
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
    wait_until,
)

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

# Far longer than any wait below: a test passes only if a signal, not a poll, did it.
SLOW = "60"

QUICK = """\
import json, os
open("result.json", "w").write(json.dumps({"outputs": {}}))
"""
LONG = "import time\ntime.sleep(120)\n"


def listening(node: LiveServer) -> bool:
    # The cache is trusted exactly while the node's listener is connected.
    return node.ctx.node.auth_cache.trusted


def test_a_run_queued_on_the_api_node_starts_at_once_on_an_idle_executor_node(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "a", database_url, roles="api") as api_node,
        live_server(
            tmp_path / "b", database_url, roles="executor", poll_interval_seconds=float(SLOW)
        ) as executor_node,
        api_node.client() as api,
    ):
        wait_until(lambda: listening(executor_node))
        deploy_folder(api, make_worker(tmp_path / "w", "name: quick\n", {"run.py": QUICK}))
        # One after another: after each, the idle executor waits for its next poll, a minute.
        for _ in range(3):
            assert_starts_at_once(api)


def assert_starts_at_once(api: httpx.Client) -> None:
    run = api.post("/api/v1/workers/quick/runs", json={"inputs": {}}).json()
    done = wait_for_run(api, run["id"], timeout=float(SLOW) / 2)
    assert done["status"] == "succeeded"
    waited = datetime.fromisoformat(done["started_at"]) - datetime.fromisoformat(done["created_at"])
    assert waited.total_seconds() < 10


def test_a_cancel_on_the_api_node_stops_the_run_on_its_executor_node_at_once(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "a", database_url, roles="api") as api_node,
        live_server(
            tmp_path / "b",
            database_url,
            roles="executor",
            heartbeat_seconds=float(SLOW),
            lease_seconds=3 * float(SLOW),
        ) as executor_node,
        api_node.client() as api,
    ):
        wait_until(lambda: listening(executor_node))
        deploy_folder(api, make_worker(tmp_path / "w", "name: long\n", {"run.py": LONG}))
        run = api.post("/api/v1/workers/long/runs", json={"inputs": {}}).json()
        wait_until(lambda: api.get(f"/api/v1/runs/{run['id']}").json()["status"] == "running")
        assert api.post(f"/api/v1/runs/{run['id']}/cancel").status_code == 200
        done = wait_for_run(api, run["id"], timeout=float(SLOW) / 3)
    assert done["status"] == "cancelled"


def test_a_key_revoked_on_one_node_is_refused_on_another_at_once(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "a", database_url, roles="api") as node_a,
        live_server(tmp_path / "b", database_url, roles="api") as node_b,
        node_a.client() as admin_a,
    ):
        wait_until(lambda: listening(node_b))
        made = admin_a.post("/api/v1/keys", json={"scopes": ["admin"], "name": "doomed"}).json()
        with node_b.client(made["key"]) as doomed_b:
            assert doomed_b.get("/api/v1/workers").status_code == 200  # now cached on b
            assert admin_a.delete(f"/api/v1/keys/{made['id']}").status_code == 200
            # The signal takes milliseconds; the cache alone would keep the key for its 10 s
            # window (from the request above). Waited for up to 8 s: a loaded machine can
            # take seconds to hand the signal over, and the cache is still not the reason.
            wait_until(lambda: doomed_b.get("/api/v1/workers").status_code == 401, timeout=8)
            minted = doomed_b.post("/api/v1/keys", json={"scopes": ["admin"], "name": "heir"})
    assert minted.status_code == 401


def test_a_node_whose_signal_connection_drops_reconnects_and_hears_again(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "a", database_url, roles="api") as api_node,
        live_server(
            tmp_path / "b", database_url, roles="executor", poll_interval_seconds=float(SLOW)
        ) as executor_node,
        api_node.client() as api,
    ):
        wait_until(lambda: listening(executor_node))
        deploy_folder(api, make_worker(tmp_path / "w", "name: quick\n", {"run.py": QUICK}))
        database = database_url.rsplit("/", 1)[1]
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name = %s",
                (database, APPLICATION_NAME),
            )
        wait_until(lambda: not listening(executor_node))
        wait_until(lambda: listening(executor_node))
        for _ in range(2):
            assert_starts_at_once(api)
