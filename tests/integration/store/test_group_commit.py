"""Runs queued at the same moment share one write transaction on SQLite (store.group_commit):
each under a savepoint of its own, answered only after the commit, each with its own result;
PostgreSQL queues each run in a transaction of its own."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from sqlmodel import col, select

from floom.bundle import read_folder
from floom.engine.queue import claim_next_run
from floom.errors import NotFound, StoreUnavailable
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs.logs import list_events
from floom.services.workers import deletion
from floom.services.workers import versions as workers
from floom.store import group_commit
from floom.store.db import session_scope, sqlite_write_lock
from floom.store.models import Run
from floom.vocabulary import RunStatus
from tests.support.harness import make_worker, wait_until
from tests.support.rigs.queues import commits


def deploy(ctx: Context, tmp_path: Path, name: str) -> None:
    folder = make_worker(tmp_path / name, f"name: {name}\n", {"run.py": "print('hi')\n"})
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive())


def sqlite(ctx: Context) -> bool:
    return ctx.engine.dialect.name == "sqlite"


def parked(ctx: Context) -> int:
    """Callers waiting for their write transaction: handed in to a batch (the leader among
    them waits for the write lock), or each waiting for the lock on its own."""
    return max(group_commit.pending(ctx.engine), sqlite_write_lock(ctx.engine).waiting())


def parked_are(ctx: Context, count: int) -> bool:
    return parked(ctx) == count


class Callers:
    """Threads that each queue one run, and what each got back (a run or an error)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.threads: list[threading.Thread] = []
        self.got: dict[int, Run | BaseException] = {}

    def queue(self, worker_name: str) -> int:
        """Start a caller queueing a run of `worker_name`; on SQLite, return once its step is
        handed in (so callers hand in in the order started). Answers the caller's number."""
        number = len(self.threads)
        handed_in = parked(self.ctx) + 1

        def call() -> None:
            try:
                self.got[number] = runs.create_run(self.ctx, worker_name=worker_name, caller=SYSTEM)
            except BaseException as exc:
                self.got[number] = exc

        thread = threading.Thread(target=call, name=f"caller-{number}")
        self.threads.append(thread)
        thread.start()
        if sqlite(self.ctx):
            wait_until(lambda: parked(self.ctx) == handed_in, timeout=10)
        return number

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads)


@contextmanager
def writer_busy(ctx: Context) -> Iterator[None]:
    """Another writer of this process holds SQLite's write lock while the block runs, as a
    run's end does when a burst's runs are queued; nothing on PostgreSQL."""
    with sqlite_write_lock(ctx.engine) if sqlite(ctx) else nullcontext():
        yield


def runs_per_commit(committed: list[list[str]]) -> list[int]:
    """How many runs each committed transaction that inserted any inserted."""
    inserted = [
        sum(statement.startswith("INSERT INTO runs ") for statement in transaction)
        for transaction in committed
    ]
    return [count for count in inserted if count]


def stored_runs(ctx: Context) -> list[Run]:
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(Run).order_by(col(Run.id))).all())


def queued_at_once(
    ctx: Context, tmp_path: Path, count: int
) -> tuple[list[Run | BaseException], list[int]]:
    """Queue `count` runs of a new worker at once, behind another writer: what each caller got
    (a run or an error), in the order they were queued, and the runs each commit carried."""
    deploy(ctx, tmp_path, "w1")
    callers = Callers(ctx)
    with commits(ctx) as committed:
        with writer_busy(ctx):
            for _ in range(count):
                callers.queue("w1")
        callers.join()
    return [callers.got[n] for n in range(count)], runs_per_commit(committed)


def test_runs_queued_at_once_are_committed_together(ctx: Context, tmp_path: Path) -> None:
    queued, per_commit = queued_at_once(ctx, tmp_path, 5)

    assert all(isinstance(run, Run) and run.status == "queued" for run in queued), queued
    if sqlite(ctx):
        assert per_commit == [5]
    else:
        assert per_commit == [1] * 5
    for run in queued:
        assert isinstance(run, Run)
        lines = [e.line for e in list_events(ctx, run_id=run.id, caller=SYSTEM)]
        assert lines[0] == f"queued (api) on version {run.version_id}"


def test_runs_committed_together_keep_the_order_they_were_queued_in(
    ctx: Context, tmp_path: Path
) -> None:
    queued, per_commit = queued_at_once(ctx, tmp_path, 4)

    ids = [run.id for run in queued if isinstance(run, Run)]
    assert len(ids) == 4
    if sqlite(ctx):  # handed in one after another, so queued in that order
        assert ids == sorted(ids)
        assert per_commit == [4]
    claimed = [claim_next_run(ctx) for _ in range(4)]
    assert [run.id for run in claimed if run is not None] == sorted(ids)


def test_a_caller_refused_in_the_transaction_fails_alone(ctx: Context, tmp_path: Path) -> None:
    if not sqlite(ctx):
        pytest.skip("PostgreSQL queues each run in a transaction of its own")
    deploy(ctx, tmp_path, "w1")
    deploy(ctx, tmp_path, "gone")
    callers = Callers(ctx)
    with commits(ctx) as committed:
        with writer_busy(ctx):
            first = callers.queue("w1")
            refused = callers.queue("gone")
            last = callers.queue("w1")
            # Deleted after its caller's checks, before its queueing transaction: the row
            # the transaction locks is gone.
            deletion.delete_worker(ctx, name="gone", purge_runs=False, caller=SYSTEM)
        callers.join()

    assert isinstance(callers.got[refused], NotFound), callers.got[refused]
    taken = [callers.got[first], callers.got[last]]
    assert all(isinstance(run, Run) for run in taken), taken
    assert [run.id for run in stored_runs(ctx)] == [run.id for run in taken if isinstance(run, Run)]
    assert runs_per_commit(committed) == [2]


def test_a_failing_step_undoes_its_own_rows_only(ctx: Context) -> None:
    if not sqlite(ctx):
        pytest.skip("PostgreSQL writes each step in a transaction of its own")
    ids = ["run_a", "run_b", "run_c"]
    answers: dict[str, object] = {}

    def step_of(run_id: str) -> Callable[[Any], str]:
        def step(conn: Any) -> str:
            row = Run(id=run_id, worker_name="w", version_id="v", status=RunStatus.QUEUED)
            conn.execute(insert(Run.__table__), [row.model_dump()])  # type: ignore[attr-defined]
            if run_id == "run_b":
                raise ValueError("refused after writing")  # its row is undone with it
            return run_id

        return step

    def call(run_id: str) -> None:
        try:
            answers[run_id] = group_commit.write_step(ctx.engine, step_of(run_id))
        except Exception as exc:
            answers[run_id] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in ids]
    with writer_busy(ctx):
        for count, thread in enumerate(threads, start=1):
            thread.start()
            wait_until(partial(parked_are, ctx, count), timeout=10)
    for thread in threads:
        thread.join(timeout=30)

    assert answers["run_a"] == "run_a"
    assert answers["run_c"] == "run_c"
    assert isinstance(answers["run_b"], ValueError)
    assert [run.id for run in stored_runs(ctx)] == ["run_a", "run_c"]


def test_a_commit_that_fails_fails_every_caller_of_its_batch_and_stores_nothing(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not sqlite(ctx):
        pytest.skip("PostgreSQL queues each run in a transaction of its own")
    deploy(ctx, tmp_path, "w1")
    dialect = ctx.engine.dialect
    real_commit = dialect.do_commit
    tried: list[int] = []

    def failing_commit(dbapi_connection: Any) -> None:
        tried.append(1)
        raise sqlite3.OperationalError("disk I/O error")

    callers = Callers(ctx)
    with commits(ctx) as written:  # commits tried: the event comes before the driver's
        with writer_busy(ctx):
            for _ in range(3):
                callers.queue("w1")
            monkeypatch.setattr(dialect, "do_commit", failing_commit)
        callers.join()
    monkeypatch.setattr(dialect, "do_commit", real_commit)

    assert tried
    assert all(isinstance(callers.got[n], StoreUnavailable) for n in range(3)), callers.got
    assert stored_runs(ctx) == []
    # The one commit tried with runs in it carried the three.
    assert runs_per_commit(written) == [3]
