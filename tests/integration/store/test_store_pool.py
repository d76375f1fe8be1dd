"""PostgreSQL connections are checked before use only when they sat idle (bench/bench_runs.py
measures the round trips this saves), and a connection that died while idle (a database
restart, an idle timeout) is replaced before anyone uses it. On SQLite a transaction's BEGIN
goes straight to the driver, and its failures still reach callers as StoreUnavailable."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from floom.errors import StoreUnavailable
from floom.store import db
from floom.store.db import make_engine, read_connection, session_scope, write_connection
from tests.support.harness import PG_ADMIN_URL


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database of its own on the test PostgreSQL server (no tables needed)."""
    name = f"floom_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_connection_that_died_while_idle_is_replaced_before_use(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(pg_url)
    try:
        with session_scope(engine) as s:
            first = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        monkeypatch.setattr(db, "IDLE_PING_SECONDS", 0.0)  # the pooled one now counts as idle
        with session_scope(engine) as s:
            second = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
    finally:
        engine.dispose()
    assert second != first


def test_a_sqlite_writer_waits_only_for_writers_of_its_own_database(tmp_path: Path) -> None:
    """The process-side SQLite write lock is per database file: a writer stuck in one
    database (a leftover thread, a slow step inside a write) does not stall writers of
    another, while two engines on one file (two nodes of a test) still queue on one lock."""
    stuck_engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    same_file = make_engine(f"sqlite:///{tmp_path / '.' / 'a.db'}")
    other_engine = make_engine(f"sqlite:///{tmp_path / 'b.db'}")
    holding, release = threading.Event(), threading.Event()

    def hold_a_write() -> None:
        with session_scope(stuck_engine, write=True) as s:
            s.execute(text("CREATE TABLE t (x INTEGER)"))
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_a_write)
    holder.start()
    try:
        assert holding.wait(10)
        wrote = threading.Event()

        def write_elsewhere() -> None:
            with session_scope(other_engine, write=True) as s:
                s.execute(text("CREATE TABLE u (x INTEGER)"))
            wrote.set()

        writer = threading.Thread(target=write_elsewhere)
        writer.start()
        writer.join(20)
        assert wrote.is_set(), "a write to another database waited for the stuck one"
        assert db.sqlite_write_lock(same_file) is db.sqlite_write_lock(stuck_engine)
        assert db.sqlite_write_lock(other_engine) is not db.sqlite_write_lock(stuck_engine)
    finally:
        release.set()
        holder.join(30)
        for engine in (stuck_engine, same_file, other_engine):
            engine.dispose()


def test_a_read_on_postgresql_keeps_the_connection_s_prepared_statements(pg_url: str) -> None:
    # A read that ended in ROLLBACK made psycopg deallocate every statement it had prepared
    # on the connection (DEALLOCATE ALL): the next statements were planned again.
    engine = make_engine(pg_url)
    engine.pool.dispose()
    statement = text("SELECT pg_backend_pid() + :n")
    try:
        with db.write_connection(engine) as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            for n in range(8):  # psycopg prepares a statement on its fifth execution
                conn.execute(statement, {"n": n})
            prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
        assert prepared
        assert prepared > 0
        with db.read_connection(engine) as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
            conn.execute(statement, {"n": 0})
            # Each statement of a read is a transaction of its own.
            first = conn.execute(text("SELECT txid_current()")).scalar_one()
            assert conn.execute(text("SELECT txid_current()")).scalar_one() > first
        with db.write_connection(engine) as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
            kept = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
            # The connection went back to the pool as it was: a write is one transaction
            # again (one transaction id for both statements).
            first = conn.execute(text("SELECT txid_current()")).scalar_one()
            assert conn.execute(text("SELECT txid_current()")).scalar_one() == first
    finally:
        engine.dispose()
    assert kept == prepared


def test_a_sqlite_connection_opened_inside_a_write_does_not_wait_for_that_write(
    tmp_path: Path,
) -> None:
    """A step that reads on a second connection while its write transaction is open (the
    alert watch masks an alert's message with secrets it reads so) gets one, even when the
    pool must open it: a new connection set auto_vacuum, which takes the write lock, and
    waited for its own thread's write until the busy timeout (CI saw the alert watch fail
    and a run's POST, queued behind that write, time out)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        with session_scope(engine, write=True) as s:
            s.execute(text("CREATE TABLE t (x INTEGER)"))
        engine.pool.dispose()  # no idle connection left: the read below opens a new one
        with session_scope(engine, write=True) as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
            with session_scope(engine) as other:
                assert other.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
        with session_scope(engine) as s:
            assert s.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
            # A new file is still made so that free pages can be handed back.
            mode = s.execute(text("PRAGMA auto_vacuum")).scalar_one()
        assert mode == db.SQLITE_INCREMENTAL_VACUUM
    finally:
        engine.dispose()


def test_work_after_a_busy_moment_stays_on_the_connection_used_last(pg_url: str) -> None:
    """The pool hands back the connection returned last (LIFO): a node's steady work stays on
    the few connections it needs, whose prepared statements and caches are warm, instead of
    going round every connection a busy moment opened (bench/bench_capacity.py: a node
    whose pool grew by one paid more PostgreSQL CPU a run, each connection preparing and
    planning every statement anew)."""
    engine = make_engine(pg_url)
    pid = text("SELECT pg_backend_pid()")
    try:
        # A busy moment: three connections open at once, given back in order.
        held = [engine.connect() for _ in range(3)]
        opened = [conn.execute(pid).scalar_one() for conn in held]
        for conn in held:
            conn.close()
        used = []
        for _ in range(4):
            with db.read_connection(engine) as conn:
                used.append(conn.execute(pid).scalar_one())
    finally:
        engine.dispose()
    assert used == [opened[-1]] * 4


def test_a_sqlite_write_that_cannot_get_the_write_lock_is_store_unavailable(
    tmp_path: Path,
) -> None:
    # BEGIN IMMEDIATE waits out the busy timeout for a lock another process holds, then the
    # driver's "database is locked" must reach the caller as floom's error (a 503 with its
    # hint), not as a driver exception (a 500): BEGIN bypasses SQLAlchemy's execution path.
    path = tmp_path / "floom.db"
    engine = make_engine(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        with write_connection(engine) as conn:
            conn.execute(text("CREATE TABLE t (a INTEGER)"))
            # The pooled connection (the only one) gives up after 50 ms instead of 30 s.
            conn.exec_driver_sql("PRAGMA busy_timeout=50")
        holder.execute("BEGIN IMMEDIATE")
        with (
            pytest.raises(StoreUnavailable, match="database is locked"),
            write_connection(engine) as conn,
        ):
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with (
            pytest.raises(StoreUnavailable, match="database is locked"),
            session_scope(engine, write=True) as s,
        ):
            s.execute(text("INSERT INTO t VALUES (1)"))
        # Reads begin without the write lock (WAL): they go on while it is held.
        with read_connection(engine) as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
        holder.execute("ROLLBACK")
        with write_connection(engine) as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with read_connection(engine) as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
    finally:
        holder.close()
        engine.dispose()
