"""Bounded lock waits on PostgreSQL, so no node waits on another's row for good.

A node frozen inside a transaction (SIGSTOP, a paused VM, a machine that stopped answering
but kept its TCP connections) holds its row locks for as long as it stays frozen, and
PostgreSQL waits for them without end. Two bounds, set on each of a node's connections at
connect (`bound_session_waits_on`): a lock wait fails after FLOOM_LOCK_TIMEOUT_SECONDS
(`lock_wait_ran_out`: an API request answers 503 `row_locked`, a loop tries again), and
PostgreSQL ends a session idle inside a transaction for FLOOM_IDLE_IN_TRANSACTION_SECONDS,
which lets the frozen node's locks go. Work of every row alike (the scheduler's pass over
all schedules) bounds its own waits tighter (`bounded_lock_waits`), so one locked row does
not stall all the others behind it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

# PostgreSQL's SQLSTATE for a lock not granted in time (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"
# PostgreSQL's SQLSTATE for a session it ended for sitting idle inside a transaction past
# idle_in_transaction_session_timeout (idle_in_transaction_session_timeout).
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
# What ends a transaction that must wait for whatever it waits for (the migration lock and
# the schema change behind it, another node's start-up steps): SET LOCAL, so only that one.
UNBOUNDED_WAITS = (
    "SELECT set_config('lock_timeout', '0', true), "
    "set_config('idle_in_transaction_session_timeout', '0', true)"
)

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


def bound_session_waits_on(
    engine: Engine, *, lock_timeout_seconds: float, idle_in_transaction_seconds: float
) -> None:
    """Have each new connection of `engine` (PostgreSQL) wait at most `lock_timeout_seconds`
    for a lock, and be ended by the server when it sits idle inside a transaction for
    `idle_in_transaction_seconds`. A bound of 0 is not set: the server's (or the role's)
    own setting holds. Set by a statement at connect, not in the startup packet's
    `options`, which a pooling proxy (PgBouncer) refuses: one round trip per new connection
    of the pool."""
    bounds = {
        name: str(max(1, int(seconds * 1000)))
        for name, seconds in (
            ("lock_timeout", lock_timeout_seconds),
            ("idle_in_transaction_session_timeout", idle_in_transaction_seconds),
        )
        if seconds > 0
    }
    if not bounds:
        return
    statement = "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in bounds)
    values = tuple(bounds.values())

    @event.listens_for(engine, "connect")
    def _bound_waits(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(statement, values)
        finally:
            cursor.close()
        dbapi_conn.commit()


def fail_ended_sessions_cleanly_on(engine: Engine) -> None:
    """Have `engine` (PostgreSQL) raise a session the server ended for its idle transaction
    as a lost connection (OperationalError: floom's StoreUnavailable, and the step is tried
    again), its connection discarded alone. psycopg raises it as an InternalError (class
    25, invalid transaction state), which read as a bug: a 500, a loop's traceback."""

    @event.listens_for(engine, "handle_error")
    def _ended_by_the_server(context: Any) -> BaseException | None:
        orig = context.original_exception
        if getattr(orig, "sqlstate", None) != IDLE_IN_TRANSACTION_TIMEOUT:
            return None
        context.is_disconnect = True
        # Only this session was ended: the pool's other connections are sound.
        context.invalidate_pool_on_disconnect = False
        return sa_exc.OperationalError(
            context.statement, context.parameters, orig, connection_invalidated=True
        )
