"""An attempt's copy of its run's stored lines and tool calls (engine/runlog.RunLog.kept),
which its end on object storage uploads instead of reading them back: the object is the one
the read-back makes, byte for byte; a line another writer stores between the attempt's
flushes or during the upload is not lost (the end's count of the lines it deletes refuses
the copy, and the lines are read back); a copy over its bound is given up. On a real
SeaweedFS, both databases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import col, func, select

from floom.agent.runner import run_agent
from floom.engine import runlog
from floom.engine.executor import Executor
from floom.engine.queue import Outcome, claim_next_run, finish_attempt
from floom.engine.runlog import RunLog
from floom.sandbox.fake import FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from floom.services.context import Context
from floom.services.ops import end_logs
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs.logs import list_events, system_event
from floom.store.blobs.configured import new_blob_store
from floom.store.blobs.tables import RunLog as RunLogRow
from floom.store.db import session_scope
from floom.store.models import RunEvent
from floom.vocabulary import RunStatus
from tests.integration.store.test_log_moves import _Interleaved
from tests.support.harness import wait_until
from tests.support.rigs.agents import notes_agent
from tests.support.rigs.queues import enqueue

pytestmark = pytest.mark.usefixtures("bucket_not_away")
DONE = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})


def _statements(ctx: Context) -> tuple[list[str], Callable[[], None]]:
    sent: list[str] = []

    def note(
        conn: object, cursor: object, statement: str, params: object, context: object, many: bool
    ) -> None:
        sent.append(" ".join(statement.split()).upper())

    event.listen(ctx.engine, "before_cursor_execute", note)
    return sent, lambda: event.remove(ctx.engine, "before_cursor_execute", note)


def _agent_run(ctx: Context, tmp_path: Path, *, step: bool = False) -> str:
    """A whole agent run (its run claimed on create, with a trigger's `step` in its queueing
    transaction or not; executor, runner and loop real; the model scripted) to its end; its
    id."""
    notes_agent(ctx, tmp_path / "agent")
    executor = Executor(ctx, FakeSandbox({}), run_agent=run_agent)
    executor.start()
    steps: list[str] = []
    try:
        run_id = runs.create_run(
            ctx,
            caller=SYSTEM,
            worker_name="agent",
            inputs={},
            in_transaction=(lambda s, run: steps.append(run.id)) if step else None,
        ).id
        assert steps == ([run_id] if step else [])
        done = wait_until(
            lambda: (r := runs.get_run(ctx, caller=SYSTEM, run_id=run_id)).finished_at and r
        )
    finally:
        executor.stop(grace_seconds=2)
    assert done.status == "succeeded"
    return run_id


def test_an_agent_run_s_end_uploads_from_its_copy_the_object_the_read_back_makes(
    s3_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end stages its log from the attempt's copy; the same end staged from a read of
    run_events and tool_calls (as before) makes the same object, byte for byte (the same
    sha256), and the run's log, tool calls and transcript read back from it."""
    stage = end_logs.stage_end_log
    staged: list[tuple[str, str]] = []

    def both(ctx: Context, **kw: Any) -> end_logs.EndLog | None:
        if kw.get("kept") is None:
            return stage(ctx, **kw)
        read_back = stage(ctx, **{**kw, "kept": None})
        from_copy = stage(ctx, **kw)
        assert read_back is not None
        assert from_copy is not None
        assert from_copy.kept
        staged.append((read_back.digest, from_copy.digest))
        return from_copy

    monkeypatch.setattr(end_logs, "stage_end_log", both)
    run_id = _agent_run(s3_ctx, tmp_path)

    assert len(staged) == 1
    read_back, from_copy = staged[0]
    assert from_copy == read_back
    with session_scope(s3_ctx.engine) as s:
        row = s.get(RunLogRow, run_id)
        assert row is not None
        assert row.digest == from_copy
        assert s.exec(select(func.count()).where(col(RunEvent.run_id) == run_id)).one() == 0
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [c.tool for c in calls] == ["write_file", "read_file", "finish"]
    lines = [e.line for e in list_events(s3_ctx, run_id=run_id, caller=SYSTEM)]
    assert lines[0].startswith("queued")
    assert lines[-1].startswith("succeeded")


@pytest.mark.parametrize("step", [False, True], ids=["created", "a trigger's step"])
def test_an_agent_run_s_end_reads_neither_its_lines_nor_its_tool_calls_back(
    s3_ctx: Context, tmp_path: Path, step: bool
) -> None:
    """A run claimed in its queueing transaction, also one a trigger's step queued (a
    schedule's fire, a webhook's delivery), ends from its copy."""
    sent, stop = _statements(s3_ctx)
    try:
        run_id = _agent_run(s3_ctx, tmp_path, step=step)
    finally:
        stop()
    reads = [q for q in sent if q.startswith("SELECT") and "FROM RUN_EVENTS" in q]
    assert reads == []
    assert _in_object(s3_ctx, run_id)
    lines = [line for _, line in _log(s3_ctx, run_id)]
    assert lines[0].startswith("queued")
    assert lines[1].startswith("started")


def _claimed(ctx: Context) -> tuple[Any, RunLog]:
    """A claimed run and its attempt's log, whose copy starts from the run's stored lines (as
    one claimed on create starts from the lines its queueing transaction wrote)."""
    enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    run_log = RunLog(
        run_id=run.id,
        attempt=run.attempt,
        redactor=Redactor([]),
        max_lines=10_000,
        max_bytes=10_000_000,
        epoch=run.lease_epoch,
    )
    with session_scope(ctx.engine) as s:
        stored = s.exec(
            select(RunEvent).where(RunEvent.run_id == run.id).order_by(col(RunEvent.seq))
        ).all()
    run_log.keep_stored(list(stored))
    return run, run_log


def _flushed(ctx: Context, run_log: RunLog, prefix: str, count: int) -> None:
    for i in range(count):
        run_log.add("stdout", f"{prefix} {i}")
    run_log.flush(ctx)


def _log(ctx: Context, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.line) for e in list_events(ctx, run_id=run_id, caller=SYSTEM)]


def _in_object(ctx: Context, run_id: str) -> bool:
    with session_scope(ctx.engine) as s:
        moved = s.get(RunLogRow, run_id) is not None
        rows = s.exec(select(func.count()).where(col(RunEvent.run_id) == run_id)).one()
    return moved and rows == 0


def _kept_then_read(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each log the ends stage comes from a copy (True) or a read."""
    stage = end_logs.stage_end_log
    made: list[bool] = []

    def noted(ctx: Context, **kw: Any) -> end_logs.EndLog | None:
        found = stage(ctx, **kw)
        if found is not None:
            made.append(found.kept)
        return found

    monkeypatch.setattr(end_logs, "stage_end_log", noted)
    return made


def test_a_line_stored_between_two_flushes_keeps_its_place(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's line (a cancel request's note) lands between two of the attempt's
    flushes: the copy numbers the second flush's lines as if it had not, the end's count
    refuses it, and the log is read back and uploaded again, that line in its place."""
    run, run_log = _claimed(s3_ctx)
    _flushed(s3_ctx, run_log, "first", 3)
    with session_scope(s3_ctx.engine, write=True) as s:
        system_event(s, run_id=run.id, attempt=1, message="cancel requested")
    _flushed(s3_ctx, run_log, "second", 2)
    made = _kept_then_read(monkeypatch)

    finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, kept=run_log.kept())

    log = _log(s3_ctx, run.id)
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    assert [line for _, line in log][1:-1] == [
        "first 0",
        "first 1",
        "first 2",
        "cancel requested",
        "second 0",
        "second 1",
    ]
    assert _in_object(s3_ctx, run.id)
    assert made == [True, False]


def test_a_line_stored_during_the_upload_from_the_copy_is_not_lost(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, run_log = _claimed(s3_ctx)
    _flushed(s3_ctx, run_log, "streamed", 2)
    bucket = new_blob_store(s3_ctx.settings, s3_ctx.engine)

    def meanwhile() -> None:
        with session_scope(s3_ctx.engine, write=True) as s:
            system_event(s, run_id=run.id, attempt=1, message="cancel requested")

    store = _Interleaved(bucket, meanwhile)
    monkeypatch.setattr(end_logs, "new_blob_store", lambda settings, engine: store)
    made = _kept_then_read(monkeypatch)

    finish_attempt(
        s3_ctx,
        run=run,
        outcome=DONE,
        backoff=0,
        log_lines=[("stdout", "buffered", None)],
        kept=run_log.kept(),
    )

    lines = [line for _, line in _log(s3_ctx, run.id)]
    assert lines[1:-1] == ["streamed 0", "streamed 1", "cancel requested", "buffered"]
    assert lines[-1].startswith("succeeded")
    assert _in_object(s3_ctx, run.id)
    assert made == [True, False]


def test_a_copy_over_its_bound_is_given_up_and_the_end_reads_the_lines_back(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "KEPT_CHARS", 1000)
    run, run_log = _claimed(s3_ctx)
    _flushed(s3_ctx, run_log, "x" * 40, 10)
    assert run_log.kept() is not None
    _flushed(s3_ctx, run_log, "y" * 40, 20)
    assert run_log.kept() is None
    made = _kept_then_read(monkeypatch)

    finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, kept=run_log.kept())

    assert made == [False]
    lines = [line for _, line in _log(s3_ctx, run.id)]
    assert len(lines) == 1 + 30 + 1
    assert lines[11] == "y" * 40 + " 0"
    assert _in_object(s3_ctx, run.id)
