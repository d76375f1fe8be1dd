"""Bounded lock waits on PostgreSQL, for a thread that must not wait on one row for good.

A node frozen inside a transaction (SIGSTOP, a paused VM, a machine that stopped answering
but kept its TCP connections) holds its row locks for as long as it stays frozen, and
PostgreSQL waits for them without end. Work of every row alike (the scheduler's pass over
all schedules) runs its transactions with a lock timeout, so a lock another node holds too
long fails that step (`lock_wait_ran_out`) instead of stalling all the others behind it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

# PostgreSQL's SQLSTATE for a lock not granted in time (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"

_LIMIT_MS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "floom_lock_wait_ms", default=None
)


@contextmanager
def bounded_lock_waits(seconds: float) -> Iterator[None]:
    """Within the block, each transaction this thread begins on PostgreSQL waits at most
    `seconds` for any lock (SET LOCAL lock_timeout); SQLite has one writer and no row locks."""
    token = _LIMIT_MS.set(max(1, int(seconds * 1000)))
    try:
        yield
    finally:
        _LIMIT_MS.reset(token)


def lock_wait_ran_out(exc: BaseException) -> bool:
    """Whether `exc` (floom's, SQLAlchemy's or the driver's error, through its causes) is
    a lock wait that ran out under bounded_lock_waits."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "orig", None)
    return False


def bound_lock_waits_on(engine: Engine) -> None:
    """Have `engine` (PostgreSQL) set the lock timeout bounded_lock_waits asks for at the
    start of each transaction: one statement more, only in such blocks."""

    @event.listens_for(engine, "begin")
    def _limit_lock_waits(conn: Connection) -> None:
        limit = _LIMIT_MS.get()
        if limit is not None and not _autocommit(conn):
            cursor: Any = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(f"SET LOCAL lock_timeout = {limit}")
            finally:
                cursor.close()


def _autocommit(conn: Connection) -> bool:
    # A read in autocommit (db.read_connection) takes no row locks, and SET LOCAL outside a
    # transaction only warns.
    return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")
