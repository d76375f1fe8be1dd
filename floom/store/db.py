"""The database engine: one per process, SQLite by default, PostgreSQL to scale out."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Float, bindparam, event, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, create_engine

from floom.config import mask_password
from floom.errors import RowLocked, StoreUnavailable
from floom.store import agents as _agent_tables  # noqa: F401 - registers the tables
from floom.store import audit as _audit_tables  # noqa: F401 - registers the tables
from floom.store import handoffs as _handoff_tables  # noqa: F401 - registers the tables
from floom.store import models
from floom.store import nodes as _node_tables  # noqa: F401 - registers the tables
from floom.store import replays as _replay_tables  # noqa: F401 - registers the tables
from floom.store import triggers as _trigger_tables  # noqa: F401 - registers the tables
from floom.store import web_sessions as _web_session_tables  # noqa: F401 - registers the tables
from floom.store.blobs import tables as _blob_tables  # noqa: F401 - registers the tables
from floom.store.models import UTCDateTime
from floom.store.statements.lock_waits import (
    UNBOUNDED_WAITS,
    bound_lock_waits_on,
    bound_session_waits_on,
    fail_ended_sessions_cleanly_on,
    lock_wait_ran_out,
)
from floom.store.statements.text import storable_parameters

log = logging.getLogger("floom.store")


# One write lock per SQLite database file, shared by every engine on that file in this
# process (two contexts on one file stand for two nodes in tests and tools). Writers to other
# files never wait on it: a thread stuck writing one database cannot stall another.
class SQLiteWriteLock:
    """A reentrant lock that counts the threads waiting for it, so maintenance that works in
    steps (give_back_free_pages) can let them through between its steps."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._guard = threading.Lock()
        self._waiting = 0
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> SQLiteWriteLock:
        with self._guard:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._guard:
                self._waiting -= 1
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, *_exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def held_here(self) -> bool:
        """Whether this thread holds the lock (a write transaction of its own is open)."""
        return self._owner == threading.get_ident()

    def waiting(self) -> int:
        """How many threads are waiting for the lock now."""
        return self._waiting


_sqlite_write_locks: dict[str, SQLiteWriteLock] = {}
_sqlite_write_locks_guard = threading.Lock()


def sqlite_write_lock(engine: Engine) -> SQLiteWriteLock:
    database = engine.url.database or ""
    lock = _sqlite_write_locks.get(database)
    if lock is None:
        file = os.path.realpath(database) if database and database != ":memory:" else database
        with _sqlite_write_locks_guard:
            lock = _sqlite_write_locks.get(file)
            if lock is None:
                lock = _sqlite_write_locks[file] = SQLiteWriteLock()
            _sqlite_write_locks[database] = lock
    return lock


def _store_storable_text(engine: Engine) -> None:
    # Below the columns' types, so no column, filter or batch (an array bound as a list) is
    # left out: text that neither database keeps is stored as store.statements.text.storable
    # makes it.
    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _storable(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
    ) -> tuple[str, Any]:
        return statement, storable_parameters(parameters)


# How long a statement waits for SQLite's locks before it fails ("database is locked").
SQLITE_BUSY_TIMEOUT_MS = 30000


def make_engine(
    url: str, *, lock_timeout_seconds: float = 0.0, idle_in_transaction_seconds: float = 0.0
) -> Engine:
    """The engine of `url`. On PostgreSQL, a node's (Context.open) bounds its lock waits and
    its transactions' idle time (floom/store/statements/lock_waits.py); 0, as for a tool's
    own engine (a copy, a backup, doctor): no bound. SQLite has one writer and no row locks:
    neither applies."""
    engine = _make_engine(url)
    if is_postgres(engine):
        fail_ended_sessions_cleanly_on(engine)
        bound_session_waits_on(
            engine,
            lock_timeout_seconds=lock_timeout_seconds,
            idle_in_transaction_seconds=idle_in_transaction_seconds,
        )
    _store_storable_text(engine)
    return engine


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=20,
            max_overflow=20,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # First: the pragmas below wait for the database's locks too, and without it
            # a connection opened while another node's writer holds them failed in 5 s
            # ("database is locked", seen under a loaded CI machine).
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            # Only takes effect on a new file (it must precede WAL, which writes the header)
            # or at the next VACUUM (rebuild_sqlite_file sets it itself before one): free
            # pages can then be handed back to the disk. So only on a new file: setting it
            # takes the write lock, even unchanged, and a connection opened while a write
            # transaction was open waited for it; opened by that writer's own thread (a
            # read inside a write, when the pool had no idle connection), it waited for
            # itself until the busy timeout, failed, and stalled every writer meanwhile.
            if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
            # SQLAlchemy then issues BEGIN itself, so writers can BEGIN IMMEDIATE.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get("floom_write", False)
            statement = "BEGIN IMMEDIATE" if immediate else "BEGIN"
            # Straight to the driver: SQLAlchemy's path for a statement (an execution
            # context, its events, a result) cost a transaction more than the BEGIN itself,
            # about 30 us of an empty write transaction's 97 (bench/README.md). Its errors
            # (the write lock held past the busy timeout) become SQLAlchemy's, as that path
            # made them, so callers see StoreUnavailable either way.
            driver = conn.dialect.loaded_dbapi
            try:
                conn.connection.driver_connection.execute(statement)  # type: ignore[union-attr]
            except driver.Error as exc:
                raise sa_exc.DBAPIError.instance(statement, None, exc, driver.Error) from exc

        return engine
    # Last in, first out: work comes back to the connection used last, so a node's steady
    # work stays on the few connections it needs, whose server-side state is warm (psycopg
    # prepares a statement on a connection after its fifth run there, and PostgreSQL then
    # keeps its plan; each backend's catalog caches). First in, first out spread every
    # statement over all the connections a busy moment ever opened, each preparing and
    # planning it anew: an agent run cost PostgreSQL about 0.9 ms of CPU more (7.5 ms
    # against 6.5; bench/bench_capacity.py, bench/README.md "Which plan changes?"). The
    # idle ones are checked before use (_ping_when_idle).
    engine = create_engine(url, pool_size=20, max_overflow=20, pool_use_lifo=True)
    _ping_when_idle(engine)
    bound_lock_waits_on(engine)
    return engine


# A pooled connection idle this long is checked before use (a database restart or an idle
# timeout may have closed it). SQLAlchemy's pool_pre_ping checks at every checkout: one more
# round trip for each of a run's several transactions, for connections just used.
IDLE_PING_SECONDS = 10.0


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["floom_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("floom_idle_since")
        if since is None or time.monotonic() - since < IDLE_PING_SECONDS:
            return  # just connected, or just used
        try:
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            dbapi_conn.rollback()
        except Exception as exc:  # any failure means: a dead connection
            # The pool discards this connection and checks out another (up to three tries).
            raise sa_exc.DisconnectionError() from exc


SQLITE_INCREMENTAL_VACUUM = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
# Pages one step of the incremental vacuum gives back (4 MiB of 4 KiB pages): a step holds
# the write lock for milliseconds, and the lock is let go between steps.
VACUUM_STEP_PAGES = 1024
# Between two steps, writers already waiting (a heartbeat, an attempt's end) go first; for at
# most this long, so a steady stream of writes cannot stall the vacuum for good.
VACUUM_YIELD_SECONDS = 1.0
# How long the checkpoint that truncates the WAL waits for readers of an older snapshot
# before it gives up (the next pass tries again): it blocks every writer while it waits.
CHECKPOINT_WAIT_MS = 200


def give_back_free_pages(engine: Engine) -> int:
    """Return the pages SQLite keeps for reuse after large deletes (retention) to the disk, in
    steps of VACUUM_STEP_PAGES that each hold the write lock briefly; answers how many pages
    were given back. Then truncate the WAL, unless a reader keeps it (tried again next pass).

    A database file made before auto_vacuum was on is left alone (its free pages are reused
    by later writes): only a full VACUUM, which holds the write lock for as long as it
    rewrites the whole file, can turn auto_vacuum on, and `floom retention compact` runs it
    when the operator asks (rebuild_sqlite_file). PostgreSQL's autovacuum keeps its tables'
    free space for reuse, so it is left alone."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return 0
    lock = sqlite_write_lock(engine)
    given = 0
    try:
        raw = engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == SQLITE_INCREMENTAL_VACUUM:
                while True:
                    with lock:
                        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
                        if not free:
                            break
                        step = min(free, VACUUM_STEP_PAGES)
                        # executescript steps the pragma to its end: execute() frees one page.
                        conn.executescript(f"PRAGMA incremental_vacuum({step});")
                        given += step
                    _let_waiting_writers_through(lock)
            _truncate_wal(conn, lock)
            return given
        finally:
            raw.close()
    except UNAVAILABLE as exc:
        raise store_unavailable(exc) from exc


def let_writers_through(engine: Engine) -> None:
    """Between two steps of maintenance that works in steps (retention's prune, the
    vacuum): let the writers already waiting for SQLite's write lock go first, for at most
    VACUUM_YIELD_SECONDS. Nothing on PostgreSQL, whose writers wait only on the rows they
    share."""
    if engine.dialect.name == "sqlite":
        _let_waiting_writers_through(sqlite_write_lock(engine))


def _let_waiting_writers_through(lock: SQLiteWriteLock) -> None:
    deadline = time.monotonic() + VACUUM_YIELD_SECONDS
    while lock.waiting() and time.monotonic() < deadline:
        time.sleep(0.001)


def _truncate_wal(conn: Any, lock: SQLiteWriteLock) -> None:
    """Checkpoint and truncate the WAL (the file shrinks only then), waiting at most
    CHECKPOINT_WAIT_MS for readers of an older snapshot: the checkpoint holds SQLite's write
    lock while it waits, and the busy timeout (30 s) would stall every writer that long."""
    with lock:
        conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    if busy:
        log.info("the SQLite WAL is still in use by a reader; truncated at the next pass")


def sqlite_file_needs_rebuild(engine: Engine) -> bool:
    """Whether this SQLite file was made before auto_vacuum was on (its free pages can only
    be given back to the disk by rebuild_sqlite_file)."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return False
    with read_connection(engine) as conn:
        mode = conn.exec_driver_sql("PRAGMA auto_vacuum").scalar()
    return mode != SQLITE_INCREMENTAL_VACUUM


def rebuild_sqlite_file(engine: Engine) -> int:
    """Rebuild the SQLite file with VACUUM, turning incremental auto_vacuum on, so its free
    pages go back to the disk; answers how many pages were free. It holds the write lock for
    the whole rewrite (minutes for a large file) and needs free disk the size of the
    database: an operator's command (`floom retention compact`), never a background pass."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return 0
    lock = sqlite_write_lock(engine)
    try:
        raw = engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            with lock:
                free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
                conn.executescript("PRAGMA auto_vacuum=INCREMENTAL; VACUUM;")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return free
        finally:
            raw.close()
    except UNAVAILABLE as exc:
        raise store_unavailable(exc) from exc


def driver_reason(exc: BaseException, url: str) -> str:
    """What the database driver said went wrong (its class and first lines: "Connection
    refused", "password authentication failed for user ..."), never the URL's password."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    said = "; ".join(lines[:2])[:300]
    password = make_url(url).password if "://" in url else None
    if password:
        said = said.replace(str(password), "***")
    return f"{type(orig).__name__}: {mask_password(said)}" if said else type(orig).__name__


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


# A transaction a step writes in: an ORM session, or a plain connection (write_connection).
Writer = Session | Connection
# What a read of Core statements only takes: an ORM session or a plain connection.
Reader = Session | Connection


def on_postgres(s: Writer) -> bool:
    """Whether the transaction `s` runs on PostgreSQL."""
    bind = s if isinstance(s, Connection) else s.get_bind()
    return bind.dialect.name == "postgresql"


# Keys of PostgreSQL advisory locks that floom takes (one number per purpose).
MIGRATION_LOCK = 0x666C6F6F6D01
BOOTSTRAP_LOCK = 0x666C6F6F6D02


@contextmanager
def cluster_lock(engine: Engine, key: int) -> Iterator[None]:
    """Hold a lock that one node of a cluster holds at a time (a PostgreSQL advisory lock on
    a connection of its own), for start-up steps that read, then write: creating the first
    admin key, deploying the examples. On SQLite the step's own write lock is enough."""
    if not is_postgres(engine):
        yield
        return
    with engine.connect() as conn:
        # Another node's start-up steps take as long as they take (deploying the examples).
        conn.exec_driver_sql(UNBOUNDED_WAITS)
        conn.exec_driver_sql("SELECT pg_advisory_lock(%s)", (key,))
        conn.commit()
        try:
            yield
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%s)", (key,))
            conn.commit()


@contextmanager
def session_scope(engine: Engine, *, write: bool = False) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error.

    On SQLite, `write=True` takes the write lock at BEGIN (and a process lock, so threads
    queue in Python instead of spinning in SQLite's busy handler): read-then-write steps
    such as claims and sequence numbers are then atomic, as FOR UPDATE makes them on
    PostgreSQL. Every session that writes must pass `write=True`.
    """
    sqlite = engine.dialect.name == "sqlite"
    bind = _write_bind(engine) if write and sqlite else engine
    try:
        with (
            sqlite_write_lock(engine) if write and sqlite else nullcontext(),
            Session(bind, expire_on_commit=False) as session,
        ):
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
    except UNAVAILABLE as exc:
        raise store_unavailable(exc) from exc


@contextmanager
def write_connection(engine: Engine) -> Iterator[Connection]:
    """session_scope(write=True) without the ORM: a plain connection in a write transaction
    that commits on success and rolls back on error, for steps that run Core statements
    only (an attempt's end, on every run): the session's unit of work, identity map and ORM
    execution path cost each such step more than its statements."""
    sqlite = engine.dialect.name == "sqlite"
    bind = _write_bind(engine) if sqlite else engine
    try:
        with sqlite_write_lock(engine) if sqlite else nullcontext(), bind.begin() as conn:
            yield conn
    except UNAVAILABLE as exc:
        raise store_unavailable(exc) from exc


# What SQLite calls the savepoint `savepoint` takes; nested ones may share it (the innermost
# of a name is the one a ROLLBACK TO or RELEASE names).
_SAVEPOINT = "floom_step"


@contextmanager
def savepoint(s: Writer) -> Iterator[None]:
    """A savepoint in `s`'s open transaction: what the block writes is undone alone when it
    raises (and the error goes on), and kept when it returns.

    On a plain SQLite connection (write_connection) its SAVEPOINT, RELEASE and ROLLBACK TO
    go straight to the driver, as the BEGIN does (_sqlite_begin): SQLAlchemy's begin_nested
    took about 280 us for a savepoint and its release against SQLite's 2, inside the write
    lock that every writer waits for. On a session or PostgreSQL: begin_nested."""
    if isinstance(s, Session) or on_postgres(s):
        with s.begin_nested():
            yield
        return
    _driver_statement(s, f"SAVEPOINT {_SAVEPOINT}")
    try:
        yield
    except BaseException:
        _driver_statement(s, f"ROLLBACK TO {_SAVEPOINT}")
        _driver_statement(s, f"RELEASE {_SAVEPOINT}")
        raise
    _driver_statement(s, f"RELEASE {_SAVEPOINT}")


def _driver_statement(conn: Connection, statement: str) -> None:
    # The driver's errors as SQLAlchemy's (so an unusable database is StoreUnavailable).
    driver = conn.dialect.loaded_dbapi
    try:
        conn.connection.driver_connection.execute(statement)  # type: ignore[union-attr]
    except driver.Error as exc:
        raise sa_exc.DBAPIError.instance(statement, None, exc, driver.Error) from exc


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """session_scope() without the ORM, for a read of Core statements only (the queue's
    look for a runnable run, twice a second on an idle node; a waiter's read of its run): a
    plain connection. On SQLite its transaction is rolled back when the block ends. On
    PostgreSQL it runs in autocommit, each statement on its own as under READ COMMITTED in
    a transaction: no BEGIN and ROLLBACK round trips, and no rollback, after which psycopg
    deallocates every statement it prepared on the connection (DEALLOCATE ALL, one more round
    trip, and the next statements planned again)."""
    try:
        with _read_bind(engine).connect() as conn:
            yield conn
    except UNAVAILABLE as exc:
        raise store_unavailable(exc) from exc


def _read_bind(engine: Engine) -> Engine:
    # Its connections go back to the pool with their isolation level reset.
    if not is_postgres(engine):
        return engine
    return _proxy(engine, "_floom_read_bind", isolation_level="AUTOCOMMIT")


def _write_bind(engine: Engine) -> Engine:
    return _proxy(engine, "_floom_write_bind", floom_write=True)


def _proxy(engine: Engine, name: str, **options: Any) -> Engine:
    """engine.execution_options(**options), made once per engine and kept on it as `name`:
    execution_options() builds a new proxy engine (~35 us), and a run opens several
    transactions. The proxy shares the engine's pool."""
    bind: Engine | None = getattr(engine, name, None)
    if bind is None:
        bind = engine.execution_options(**options)
        setattr(engine, name, bind)
    return bind


# What the driver raises when the database cannot be reached or used right now (a lost
# server, a dropped database, a full pool, a lock held past the busy timeout); anything
# else from the driver is a bug and stays a 500.
UNAVAILABLE: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
)


# What a caller refused with RowLocked is told to wait (Retry-After) before trying again.
ROW_LOCKED_RETRY_AFTER_SECONDS = 2


def store_unavailable(exc: Exception) -> StoreUnavailable:
    """The driver's failure as floom's error, without the URL or the driver's internals; a
    lock wait that ran out (another node holds the row) as RowLocked."""
    if lock_wait_ran_out(exc):
        return RowLocked(
            "another floom node has held a row this needs for longer than the lock timeout "
            "(FLOOM_LOCK_TIMEOUT_SECONDS): busy with it, or frozen inside a transaction",
            hint="try again shortly; a frozen node's locks go when it thaws, or when "
            "PostgreSQL ends its transaction (FLOOM_IDLE_IN_TRANSACTION_SECONDS)",
            details={"retry_after_seconds": ROW_LOCKED_RETRY_AFTER_SECONDS},
        )
    reason = mask_password(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200])
    return StoreUnavailable(
        f"floom's database is unavailable: {reason}",
        hint="check that the database server is running and reachable "
        "(FLOOM_DATABASE_URL); floom retries on the next request",
    )


# The database's clock: one time for every node that shares the store, whatever each node's
# own clock says. What orders or judges across nodes (the alert watch, delivery claims, when
# a node was last heard) reads and writes it, so a node whose clock runs minutes ahead or
# behind neither skips nor repeats what another node wrote.


class db_now(FunctionElement[datetime]):
    """The database's time now, `seconds` on: usable wherever a timestamp column is
    (compared with one, or written to one)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__(bindparam(None, float(seconds), type_=Float()))


@compiles(db_now, "postgresql")
def _postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"(clock_timestamp() + {seconds} * interval '1 second')"


@compiles(db_now, "sqlite")
def _sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    # As SQLAlchemy stores a SQLite timestamp (UTC, six digits of fraction): the two
    # compare as text, and it reads back as one.
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {seconds} || ' seconds') || '000')"


def database_now(s: Session) -> datetime:
    """The database's time (one statement)."""
    at: datetime = s.execute(select(db_now())).scalar_one()
    return at


# The lease fence's clock (floom/sandbox/fence.py, lease_clock): a database reading is tied
# to it, so a watchdog deadline and a stored expiry count from one moment.
_BOOTTIME = time.CLOCK_BOOTTIME
# A node reads the database's clock again after this long even when no heartbeat has (a
# node without an executor); the boottime counted since a reading drifts from the
# database's clock by parts per million, the rate at which the two clocks' rates differ.
CLOCK_READ_SECONDS = 30.0


@dataclass(frozen=True)
class _Reading:
    at: datetime  # the database's clock_timestamp()
    sent: float  # boottime just before the statement was sent
    back: float  # boottime just after its answer came back


class DatabaseClock:
    """The database's time as a node knows it without a statement: the time every node that
    shares the store writes and judges leases, and the scheduler fires ticks, by.

    On PostgreSQL the node reads the database's clock (`refresh`, one statement: at each
    heartbeat of its executor, and when its last reading is older than CLOCK_READ_SECONDS),
    with CLOCK_BOOTTIME just before the statement left and just after its answer came back.
    The database's time at a later moment is the reading plus the boottime since. The
    database read its clock somewhere between the two, so `now` (counted from the send)
    is never earlier than the database's true time and `earliest` (counted from the
    answer) never later: they differ by the round trip. The node's own wall clock plays no
    part, so a node minutes off, or one whose clock is stepped, writes and judges times as
    every other node does. On SQLite (one host, one clock) it is this host's wall clock.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._postgres = is_postgres(engine)
        self._reading: _Reading | None = None
        self._lock = threading.Lock()
        self._refreshing = False

    def reading(self) -> tuple[float, datetime]:
        """Now on the fence's clock (lease_clock) and the database's time then, never earlier
        than the true one: a lease written as that time plus its length never outlasts a
        watchdog deadline counted from the first by the same length."""
        if not self._postgres:
            return time.clock_gettime(_BOOTTIME), models.utcnow()
        reading = self._current()
        boottime = time.clock_gettime(_BOOTTIME)
        return boottime, reading.at + timedelta(seconds=boottime - reading.sent)

    def now(self) -> datetime:
        """The database's time now, never earlier than the true one (`reading`): for times
        written (leases, when a run started or ended, a retry's backoff)."""
        return self.reading()[1]

    def earliest(self) -> datetime:
        """The database's time now, never later than the true one: for judging whether
        another node's lease expired, or a tick came."""
        if not self._postgres:
            return models.utcnow()
        reading = self._current()
        return reading.at + timedelta(seconds=time.clock_gettime(_BOOTTIME) - reading.back)

    def refresh(self) -> None:
        """Read the database's clock again (one statement; nothing on SQLite)."""
        if not self._postgres:
            return
        with read_connection(self._engine) as conn:
            sent = time.clock_gettime(_BOOTTIME)
            at = conn.execute(select(db_now())).scalar_one()
            back = time.clock_gettime(_BOOTTIME)
        self._reading = _Reading(at=at, sent=sent, back=back)

    def _current(self) -> _Reading:
        """The last reading. Callers ask inside their own transactions, so a reading older
        than CLOCK_READ_SECONDS is refreshed on a thread of its own (a second connection
        taken here would nest in the caller's: a full pool then waits on itself); it drifts
        by parts per million meanwhile. Only a clock never read is read here, once
        (Context.open reads it first)."""
        reading = self._reading
        if reading is None:
            with self._lock:
                if self._reading is None:
                    self.refresh()
            assert self._reading is not None
            return self._reading
        if time.clock_gettime(_BOOTTIME) - reading.back >= CLOCK_READ_SECONDS:
            self._refresh_aside()
        return reading

    def _refresh_aside(self) -> None:
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True

        def refresh() -> None:
            try:
                self.refresh()
            except Exception as exc:  # cut off from the database: the last reading holds
                log.debug("reading the database's clock failed: %s", exc)
            finally:
                self._refreshing = False

        threading.Thread(target=refresh, name="floom-db-clock", daemon=True).start()


def database_clock(bind: Engine | Connection) -> DatabaseClock:
    """The database's clock as this process knows it (one per engine)."""
    return per_engine(bind.engine, "_floom_clock", DatabaseClock)


def per_engine(engine: Engine, attribute: str, make: Callable[[Engine], _Kept]) -> _Kept:
    """The one `make(engine)` this process keeps on `engine` under `attribute` (made at the
    first call, under a lock), as _proxy keeps its binds."""
    kept: _Kept | None = getattr(engine, attribute, None)
    if kept is None:
        with _per_engine_guard:
            kept = getattr(engine, attribute, None)
            if kept is None:
                kept = make(engine)
                setattr(engine, attribute, kept)
    return kept


_Kept = TypeVar("_Kept")
_per_engine_guard = threading.Lock()
