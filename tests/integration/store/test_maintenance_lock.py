"""Maintenance never holds SQLite's write lock for an unbounded time: retention deletes a
long log and gives free pages back in short steps that let a heartbeat's write through
between them, and the WAL checkpoint gives up behind a reader instead of stalling every
writer for the busy timeout."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert
from sqlalchemy.engine import Engine

from floom.services.context import Context
from floom.services.ops import retention
from floom.store import db
from floom.store.db import give_back_free_pages, make_engine, session_scope, write_connection
from floom.store.models import Run, RunEvent, new_id, utcnow
from floom.vocabulary import RunStatus
from tests.support.harness import fast_settings, wait_until


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'floom.db'}")
    yield engine
    engine.dispose()


def _big_freelist(engine: Engine, pages: int) -> int:
    """Fill a table with about `pages` pages and delete it all: answers the free pages."""
    with write_connection(engine) as c:
        c.exec_driver_sql("CREATE TABLE filler (b BLOB)")
        c.exec_driver_sql("CREATE TABLE beat (at INTEGER)")
        for _ in range(pages):
            c.exec_driver_sql("INSERT INTO filler VALUES (randomblob(3900))")
    with write_connection(engine) as c:
        c.exec_driver_sql("DELETE FROM filler")
    with write_connection(engine) as c:
        free = int(c.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
        assert c.exec_driver_sql("PRAGMA auto_vacuum").scalar() == db.SQLITE_INCREMENTAL_VACUUM
    return free


def test_a_heartbeat_commits_between_two_steps_of_giving_free_pages_back(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "VACUUM_STEP_PAGES", 100)
    free = _big_freelist(engine, 600)
    assert free >= 500
    lock = db.sqlite_write_lock(engine)
    events: list[str] = []
    writer_started = threading.Event()
    failures: list[BaseException] = []

    def heartbeat() -> None:
        try:
            with write_connection(engine) as c:
                c.exec_driver_sql("INSERT INTO beat VALUES (1)")
                # Still under the write lock, which it lets go only after committing: no
                # vacuum step can come between this and the commit.
                events.append("heartbeat committed")
        except BaseException as exc:  # seen by the test's thread below
            failures.append(exc)

    writer = threading.Thread(target=heartbeat)

    def trace(statement: str) -> None:
        if "incremental_vacuum" not in statement:
            return
        events.append("vacuum step")
        if not writer_started.is_set():
            # The vacuum holds the lock now: the heartbeat comes and has to wait for it.
            writer_started.set()
            writer.start()
            wait_until(lambda: lock.waiting() >= 1, timeout=10, interval=0.001)

    @event.listens_for(engine, "connect")
    def _trace(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_trace_callback(trace)

    engine.dispose()  # new connections, each traced
    given = give_back_free_pages(engine)
    writer.join(timeout=30)

    assert not failures, failures
    assert given == free
    assert "heartbeat committed" in events
    # The heartbeat got the lock after a step and before the vacuum had done: not held behind
    # the whole freelist.
    committed = events.index("heartbeat committed")
    assert "vacuum step" in events[committed + 1 :], events
    with write_connection(engine) as c:
        assert c.exec_driver_sql("PRAGMA freelist_count").scalar() == 0
        assert c.exec_driver_sql("SELECT count(*) FROM beat").scalar() == 1


def test_a_heartbeat_commits_between_two_steps_of_pruning_a_long_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "PRUNE_STEP_ROWS", 500)
    ctx = Context.open(fast_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}"))
    engine = ctx.engine
    run = Run(
        id=new_id("run"),
        worker_name="long",
        version_id="v",
        status=RunStatus.SUCCEEDED,
        finished_at=utcnow() - timedelta(days=30),
    )
    with session_scope(engine, write=True) as s:
        s.add(run)
    with write_connection(engine) as c:
        c.exec_driver_sql("CREATE TABLE beat (at INTEGER)")
        lines = [
            {"run_id": run.id, "seq": n, "stream": "stdout", "line": f"line {n}"}
            for n in range(3000)
        ]
        c.execute(insert(RunEvent), lines)
    lock = db.sqlite_write_lock(engine)
    events: list[str] = []
    writer_started = threading.Event()
    failures: list[BaseException] = []

    def heartbeat() -> None:
        try:
            with write_connection(engine) as c:
                c.exec_driver_sql("INSERT INTO beat VALUES (1)")
                events.append("heartbeat committed")  # under the lock until its commit
        except BaseException as exc:  # seen by the test's thread below
            failures.append(exc)

    writer = threading.Thread(target=heartbeat)

    def trace(statement: str) -> None:
        if not statement.startswith("DELETE FROM run_events"):
            return
        events.append("prune step")
        if not writer_started.is_set():
            # The prune holds the lock now: the heartbeat comes and has to wait for it.
            writer_started.set()
            writer.start()
            wait_until(lambda: lock.waiting() >= 1, timeout=10, interval=0.001)

    @event.listens_for(engine, "connect")
    def _trace(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_trace_callback(trace)

    engine.dispose()  # new connections, each traced
    try:
        report = retention.apply_retention(ctx, days=7)
        writer.join(timeout=30)
    finally:
        engine.dispose()

    assert not failures, failures
    assert (report.runs_pruned, report.log_lines_deleted) == (1, 3000)
    # The heartbeat got the lock after a step and before the prune had done: not held behind
    # the whole log.
    committed = events.index("heartbeat committed")
    assert "prune step" in events[committed + 1 :], events
    with write_connection(engine) as c:
        assert c.exec_driver_sql("SELECT count(*) FROM run_events").scalar() == 0
        assert c.exec_driver_sql("SELECT count(*) FROM beat").scalar() == 1


def test_the_checkpoint_gives_up_behind_a_reader_and_truncates_at_the_next_pass(
    engine: Engine, tmp_path: Path
) -> None:
    wal = tmp_path / "floom.db-wal"
    with write_connection(engine) as c:
        c.exec_driver_sql("CREATE TABLE t (b BLOB)")
        c.exec_driver_sql("INSERT INTO t VALUES (randomblob(100000))")
    assert _big_freelist(engine, 50) > 0  # a pass with pages to give back, then the WAL
    events: list[str] = []
    reading = threading.Event()
    done = threading.Event()

    def reader() -> None:
        # A long read (a backup, a large listing) on a snapshot older than the WAL's end.
        conn = sqlite3.connect(tmp_path / "floom.db", isolation_level=None)
        try:
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM t").fetchone()
            reading.set()
            if not done.wait(timeout=10):
                events.append("reader ended before the pass returned")
            conn.execute("COMMIT")
        finally:
            conn.close()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert reading.wait(timeout=30)
        with write_connection(engine) as c:
            c.exec_driver_sql("INSERT INTO t VALUES (randomblob(100000))")
        give_back_free_pages(engine)
        events.append("pass returned")
    finally:
        done.set()
        thread.join(timeout=30)

    assert events == ["pass returned"], events
    assert wal.stat().st_size > 0  # left for the next pass: the reader kept it
    give_back_free_pages(engine)
    assert wal.stat().st_size == 0
