"""The executor's log flusher writes a run's lines once they have waited a flush interval:
a run that ends sooner has its lines written with its end, in that one transaction, and a
longer run's lines still reach the store while it runs (engine/runlog.RunLog.flush)."""

from __future__ import annotations

import time

from floom.engine.runlog import RunLog
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from floom.services.context import Context
from floom.services.runs.logs import list_events
from tests.support.rigs.queues import enqueue


def run_log_of(ctx: Context) -> RunLog:
    [run_id] = enqueue(ctx, 1)
    return RunLog(run_id=run_id, attempt=1, redactor=Redactor([]), max_lines=100, max_bytes=100_000)


def stored(ctx: Context, run_log: RunLog) -> list[str]:
    return [e.line for e in list_events(ctx, run_id=run_log.run_id, caller=SYSTEM)]


def test_a_line_younger_than_the_interval_is_left_for_the_runs_end(ctx: Context) -> None:
    run_log = run_log_of(ctx)
    run_log.add("stdout", "fresh")
    run_log.flush(ctx, waited=60.0)
    assert stored(ctx, run_log) == []
    # The run's end takes it, to store it in its own transaction.
    assert [line for _, line, _ in run_log.drain()] == ["fresh"]


def test_lines_are_written_once_the_oldest_has_waited_the_interval(ctx: Context) -> None:
    run_log = run_log_of(ctx)
    run_log.add("stdout", "first")
    time.sleep(0.06)
    run_log.add("stdout", "second")  # younger, but written with the one that waited
    run_log.flush(ctx, waited=0.05)
    assert stored(ctx, run_log) == ["first", "second"]
    assert run_log.drain() == []
    run_log.add("stdout", "third")  # the wait starts again with the next line
    run_log.flush(ctx, waited=0.05)
    assert stored(ctx, run_log) == ["first", "second"]


def test_a_flush_without_a_wait_writes_at_once(ctx: Context) -> None:
    # The executor's stop writes whatever is pending, however young.
    run_log = run_log_of(ctx)
    run_log.add("stdout", "now")
    run_log.flush(ctx)
    assert stored(ctx, run_log) == ["now"]
