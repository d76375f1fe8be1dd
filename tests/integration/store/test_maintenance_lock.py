"""Maintenance never holds SQLite's write lock for an unbounded time: retention deletes a
long log and gives free pages back in short steps that let a heartbeat's write through
between them, and the WAL checkpoint gives up behind a reader instead of stalling every
writer for the busy timeout."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
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


class HeartbeatAtFirstStep:
    """Traces the engine's statements: each step of maintenance (a statement `is_step` picks)
    is recorded as `step`, and while the first one holds SQLite's write lock a heartbeat
    comes to write and has to wait for it; its commit is recorded as "heartbeat committed"."""

    def __init__(self, engine: Engine, *, is_step: Callable[[str], bool], step: str) -> None:
        self.events: list[str] = []
        self.failures: list[BaseException] = []
        self._engine = engine
        self._lock = db.sqlite_write_lock(engine)
        self._is_step = is_step
        self._step = step
        self._writer = threading.Thread(target=self._heartbeat)
        self._writer_started = threading.Event()
        event.listen(engine, "connect", self._trace_connection)
        engine.dispose()  # new connections, each traced

    def join(self) -> None:
        """Waits for the heartbeat, which must have written."""
        self._writer.join(timeout=30)
        assert not self.failures, self.failures
        assert "heartbeat committed" in self.events, self.events

    def committed_before_a_step(self) -> bool:
        """Whether the heartbeat got the lock between two steps: not held behind them all."""
        committed = self.events.index("heartbeat committed")
        return self._step in self.events[committed + 1 :]

    def _heartbeat(self) -> None:
        try:
            with write_connection(self._engine) as c:
                c.exec_driver_sql("INSERT INTO beat VALUES (1)")
                # Still under the write lock, which it lets go only after committing: no
                # step can come between this and the commit.
                self.events.append("heartbeat committed")
        except BaseException as exc:  # seen by the test's thread
            self.failures.append(exc)

    def _trace(self, statement: str) -> None:
        if not self._is_step(statement):
            return
        self.events.append(self._step)
        if not self._writer_started.is_set():
            # The step holds the lock now: the heartbeat comes and has to wait for it.
            self._writer_started.set()
            self._writer.start()
            wait_until(lambda: self._lock.waiting() >= 1, timeout=10, interval=0.001)

    def _trace_connection(self, dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_trace_callback(self._trace)


def test_a_heartbeat_commits_between_two_steps_of_giving_free_pages_back(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "VACUUM_STEP_PAGES", 100)
    free = _big_freelist(engine, 600)
    assert free >= 500
    heartbeat = HeartbeatAtFirstStep(
        engine, is_step=lambda statement: "incremental_vacuum" in statement, step="vacuum step"
    )
    given = give_back_free_pages(engine)
    heartbeat.join()

    assert given == free
    assert heartbeat.committed_before_a_step(), heartbeat.events
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
    heartbeat = HeartbeatAtFirstStep(
        engine,
        is_step=lambda statement: statement.startswith("DELETE FROM run_events"),
        step="prune step",
    )
    try:
        report = retention.apply_retention(ctx, days=7)
        heartbeat.join()
    finally:
        engine.dispose()

    assert (report.runs_pruned, report.log_lines_deleted) == (1, 3000)
    assert heartbeat.committed_before_a_step(), heartbeat.events
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
