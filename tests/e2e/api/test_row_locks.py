"""A request behind a row another node holds (frozen inside its transaction: SIGSTOP, a
paused VM) answers 503 `row_locked` with Retry-After once FLOOM_LOCK_TIMEOUT_SECONDS has
passed, on REST and MCP alike, instead of waiting for as long as that node stays frozen. A
connection of its own holding the worker's row FOR UPDATE stands for the frozen node."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import sqlalchemy

from floom.store.db import make_engine
from tests.e2e.api.test_triggers_webhooks import hook, runs_of, setup_standard, standard_headers
from tests.e2e.api.test_waits import NOOP, deploy, make_server
from tests.support.harness import LiveServer, wait_until
from tests.support.mcp_clients import call_error, http_client

__all__ = ["make_server"]  # the fixture, shared with test_waits

# Short, so a test waits a second; the default (10 s) is what a node runs with.
LOCK_TIMEOUT = 1.0


@contextmanager
def frozen_node_holding(database_url: str, worker: str) -> Iterator[None]:
    """Another node's transaction holding `worker`'s row, as when that node froze inside it
    (as an operator set the worker's state, or paused it)."""
    engine = make_engine(database_url)
    conn = engine.connect()
    try:
        conn.begin()
        conn.execute(
            sqlalchemy.text("SELECT name FROM workers WHERE name = :n FOR UPDATE"), {"n": worker}
        )
        yield
    finally:
        conn.rollback()
        conn.close()
        engine.dispose()


def answered_in_thread(send: Callable[[], Any]) -> list[Any]:
    """What `send` answers (or raises), appended once it returns: a request that hangs
    fails the test at wait_until's deadline instead of hanging it."""
    answers: list[Any] = []

    def sending() -> None:
        try:
            answers.append(send())
        except Exception as exc:  # the test asserts on it
            answers.append(exc)

    threading.Thread(target=sending, daemon=True).start()
    return answers


def test_a_run_started_behind_a_frozen_node_s_lock_answers_503_row_locked_with_retry_after(
    make_server: Callable[..., LiveServer], tmp_path: Path, database_url: str
) -> None:
    server = make_server(lock_timeout_seconds=LOCK_TIMEOUT, idle_in_transaction_seconds=0)
    with server.client() as api:
        deploy(api, tmp_path, "held", NOOP)
        if server.ctx.engine.dialect.name != "postgresql":
            # One SQLite node has no other node's row locks, and no such setting touches it.
            assert api.post("/api/v1/workers/held/runs", json={}).status_code == 202
            return
        with frozen_node_holding(database_url, "held"):
            answers = answered_in_thread(
                lambda: api.post("/api/v1/workers/held/runs", json={}, timeout=60)
            )
            (resp,) = wait_until(lambda: answers, timeout=30)
            assert isinstance(resp, httpx.Response), resp
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "row_locked"
            assert "FLOOM_LOCK_TIMEOUT_SECONDS" in error["message"]
            assert error["hint"]
            assert resp.headers["Retry-After"] == str(error["details"]["retry_after_seconds"])
            runs = api.get("/api/v1/runs", params={"worker": "held"}).json()["items"]
            assert runs == []  # nothing was written
        # Let go (the node thawed, or died): the same request starts the run.
        assert api.post("/api/v1/workers/held/runs", json={}).status_code == 202


def test_an_mcp_tool_behind_a_frozen_node_s_lock_answers_the_row_locked_error(
    make_server: Callable[..., LiveServer], tmp_path: Path, database_url: str
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("row locks of one node held against another: PostgreSQL")
    server = make_server(lock_timeout_seconds=LOCK_TIMEOUT, idle_in_transaction_seconds=0)
    with server.client() as api:
        deploy(api, tmp_path, "held", NOOP)

    async def session() -> dict[str, Any]:
        async with http_client(server) as mcp:
            return await call_error(mcp, "run_worker", worker="held")

    with frozen_node_holding(database_url, "held"):
        answers = answered_in_thread(lambda: anyio.run(session))
        (error,) = wait_until(lambda: answers, timeout=30)
    assert isinstance(error, dict), error
    assert error["code"] == "row_locked"
    assert "FLOOM_LOCK_TIMEOUT_SECONDS" in error["message"]


def test_a_webhook_behind_a_frozen_node_s_lock_answers_503_so_the_sender_retries_it(
    make_server: Callable[..., LiveServer], tmp_path: Path, database_url: str
) -> None:
    # Not a start written off as failed (a skipped run the sender's retry then duplicates):
    # the sender's retry of the same delivery starts the run once the row is let go.
    if not database_url.startswith("postgresql"):
        pytest.skip("row locks of one node held against another: PostgreSQL")
    server = make_server(lock_timeout_seconds=LOCK_TIMEOUT, idle_in_transaction_seconds=0)
    body = json.dumps({"action": "opened"}).encode()
    with server.client() as api:
        setup_standard(api, tmp_path)
        with frozen_node_holding(database_url, "std"):
            answers = answered_in_thread(
                lambda: hook(server, "/hooks/std", body, standard_headers(body, "msg_1"))
            )
            (resp,) = wait_until(lambda: answers, timeout=30)
        assert isinstance(resp, httpx.Response), resp
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "row_locked"
        assert "Retry-After" in resp.headers
        assert runs_of(api, "std") == []
        again = hook(server, "/hooks/std", body, standard_headers(body, "msg_1"))
        assert again.status_code == 202, again.text
        assert again.json()["outcome"] == "run"
        (run,) = runs_of(api, "std")
        assert run["status"] != "skipped"
