"""Group commit on SQLite: write steps that threads hand in at the same moment share one write
transaction, each under a savepoint of its own, and one commit (a burst's queueing)."""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection, Engine

from floom.store.db import (
    UNAVAILABLE,
    is_postgres,
    per_engine,
    savepoint,
    sqlite_write_lock,
    write_connection,
)

T = TypeVar("T")

# The most steps one transaction takes: every other writer (a run's end, a heartbeat) waits
# for the write lock while it is held, so a batch is bounded (a step of queueing holds it for
# about 0.3 ms).
MAX_BATCH = 32


def write_step(engine: Engine, step: Callable[[Connection], T]) -> T:
    """`step(conn)` in a write transaction that commits, as write_connection runs it, and
    answers what it returned; what it raises undoes what it wrote and reaches the caller.

    On SQLite the steps that threads hand in while another batch holds the write lock are
    written together once the lock is free: one BEGIN IMMEDIATE, each step under a SAVEPOINT
    of its own (a step that raises is rolled back alone and its error goes to its caller
    only), one COMMIT; then each caller gets its own answer. Nothing is answered before the
    commit: a commit that fails fails every step of its batch (StoreUnavailable when the
    database is unavailable), and none of them wrote anything. Steps run in the order they
    were handed in, each in whichever caller's thread leads the batch: a step must not rely
    on its thread (thread-locals, the write lock held by its caller). A thread that holds the
    write lock already writes on its own (the batch's leader would wait for it).

    On PostgreSQL each step is a transaction of its own: its writers do not serialise on
    one lock, and a savepoint costs two round trips."""
    if is_postgres(engine):
        with write_connection(engine) as conn:
            return step(conn)
    group = _group_of(engine)
    if group.held_here():
        with write_connection(engine) as conn:
            return step(conn)
    return group.write(step)


def pending(engine: Engine) -> int:
    """How many steps are handed in on `engine` and not yet taken into a batch."""
    group: _Group | None = getattr(engine, _GROUP_ATTRIBUTE, None)
    return 0 if group is None else group.pending()


class _Step(Generic[T]):
    """A step handed in, and its answer once its batch committed (or the call to lead)."""

    __slots__ = ("answered", "error", "lead", "result", "step")

    def __init__(self, step: Callable[[Connection], T]) -> None:
        self.step = step
        self.answered = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.lead = False

    def answer(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class _Group:
    """The steps waiting for one SQLite database's write lock in this process, and whether a
    thread leads a batch now. The leader is the first caller to find no leader; once its
    batch is answered it hands the lead to the oldest step still waiting, whose caller then
    writes the next batch: every caller's thread returns with its own answer."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = sqlite_write_lock(engine)
        self._guard = threading.Lock()
        self._waiting: deque[_Step[Any]] = deque()
        self._leading = False

    def held_here(self) -> bool:
        return self._lock.held_here()

    def pending(self) -> int:
        with self._guard:
            return len(self._waiting)

    def write(self, step: Callable[[Connection], T]) -> T:
        mine = _Step(step)
        with self._guard:
            self._waiting.append(mine)
            lead = mine.lead = not self._leading
            self._leading = True
        if not lead:
            mine.answered.wait()
        if mine.lead:  # first, or handed the lead: the oldest step is this one
            try:
                self._write_batch()
            finally:
                self._hand_over()
        return mine.answer()

    def _hand_over(self) -> None:
        with self._guard:
            if not self._waiting:
                self._leading = False
                return
            following = self._waiting[0]
            following.lead = True
        following.answered.set()

    def _write_batch(self) -> None:
        # The batch is taken once the process's write lock is this thread's (whatever queued
        # while it waited), and before BEGIN: a BEGIN that fails fails the batch taken.
        with self._lock:
            with self._guard:
                batch = [self._waiting.popleft() for _ in range(min(MAX_BATCH, len(self._waiting)))]
            try:
                with write_connection(self._engine) as conn:
                    if len(batch) == 1:  # alone: its error undoes the transaction, as without
                        batch[0].result = batch[0].step(conn)
                    else:
                        for each in batch:
                            _write_under_savepoint(conn, each)
            except BaseException as exc:
                # BEGIN or COMMIT failed, or the lone step raised: the batch wrote nothing.
                failed = [each for each in batch if each.error is None]
                for each in failed:
                    each.result = None
                    each.error = exc if len(failed) == 1 else _own_copy(exc)
            finally:
                for each in batch:
                    if not each.lead:
                        each.answered.set()


def _own_copy(exc: BaseException) -> BaseException:
    """`exc` as an exception of each caller's own, raised in its own thread."""
    mine = copy.copy(exc)
    mine.__cause__ = exc
    return mine


def _write_under_savepoint(conn: Connection, each: _Step[Any]) -> None:
    try:
        with savepoint(conn):
            each.result = each.step(conn)
    except UNAVAILABLE:
        raise  # the database failed, not the step: the batch's transaction with it
    except Exception as exc:  # this caller's failure: undone alone, reported to it only
        each.error = exc


def _group_of(engine: Engine) -> _Group:
    return per_engine(engine, _GROUP_ATTRIBUTE, _Group)


_GROUP_ATTRIBUTE = "_floom_group_commit"  # kept on the engine (store.db.per_engine)
