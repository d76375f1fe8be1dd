"""A node frozen inside a transaction (SIGSTOP, a paused VM) holds its row locks only until
PostgreSQL ends its session for sitting idle in it (FLOOM_IDLE_IN_TRANSACTION_SECONDS): then
the other nodes' work on those rows goes on, and the frozen node, once it thaws, fails that
transaction as an unavailable database, having written nothing. Two contexts on one
database stand for the two nodes; a thread that stops inside its transaction, for the frozen
one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import col

from floom.errors import RowLocked, StoreUnavailable
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.store.db import session_scope
from floom.store.models import Run, Worker
from tests.support.harness import deploy_in_store, fast_settings, make_worker, wait_until

# Short, so a test waits a second or two; the defaults (10 s, 60 s) are a node's.
IDLE_BOUND = 1.0
LOCK_TIMEOUT = 0.5


@pytest.fixture
def nodes(tmp_path: Path, database_url: str) -> Iterator[tuple[Context, Context]]:
    if not database_url.startswith("postgresql"):
        pytest.skip("one node's row locks held against another's: PostgreSQL")
    bounds = {"lock_timeout_seconds": LOCK_TIMEOUT, "idle_in_transaction_seconds": IDLE_BOUND}
    here = Context.open(fast_settings(tmp_path / "here", database_url, **bounds))
    frozen = Context.open(fast_settings(tmp_path / "frozen", database_url, **bounds))
    try:
        yield here, frozen
    finally:
        here.engine.dispose()
        frozen.engine.dispose()


def started(ctx: Context, worker: str) -> Run | None:
    try:
        return runs.create_run(ctx, worker_name=worker, caller=SYSTEM)
    except RowLocked:
        return None  # the frozen node still holds the worker's row


def keep_starting(ctx: Context) -> Run:
    while True:
        run = started(ctx, "held")
        if run is not None:
            return run


def test_postgresql_ends_a_frozen_node_s_transaction_so_its_locks_go_and_it_fails_on_thaw(
    nodes: tuple[Context, Context], tmp_path: Path
) -> None:
    here, frozen = nodes
    deploy_in_store(here, make_worker(tmp_path / "held", "name: held\n", {"run.py": "pass\n"}))
    locked, thaw = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def frozen_node() -> None:
        # Pausing the worker, it froze with the worker's row locked; thawed, it goes on.
        try:
            with session_scope(frozen.engine, write=True) as s:
                s.get(Worker, "held", with_for_update=True)
                locked.set()
                thaw.wait(60)
                s.execute(update(Worker).where(col(Worker.name) == "held").values(paused=True))
            outcome.append(None)
        except BaseException as exc:  # the test asserts on it
            outcome.append(exc)

    thread = threading.Thread(target=frozen_node, daemon=True)
    thread.start()
    try:
        assert locked.wait(30)
        # Behind the lock, a start fails fast (RowLocked), until PostgreSQL ends the frozen
        # node's session; then it starts. (On a thread: one that waits for good fails the
        # test at the deadline instead of hanging it.)
        starts: list[Run] = []
        threading.Thread(target=lambda: starts.append(keep_starting(here)), daemon=True).start()
        (run,) = wait_until(lambda: starts, timeout=30)
        assert run.worker_name == "held"
    finally:
        thaw.set()
        thread.join(30)
    (error,) = outcome
    assert isinstance(error, StoreUnavailable), error
    with session_scope(here.engine) as s:
        worker = s.get(Worker, "held")
        assert worker is not None
        assert not worker.paused  # the frozen node wrote nothing
    # Its engine serves the node's next transactions (the ended connection was discarded).
    assert started(frozen, "held") is not None
