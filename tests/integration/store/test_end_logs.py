"""A run's log put into its object as its end is recorded (services/ops/end_logs.py, with
FLOOM_BLOB_STORE=s3): the lines still buffered at the end never pass through run_events; a
follower sees every line once, in order, across the end; a line that comes between the read
and the end, a bucket that is away and an end that fails after the upload lose nothing. On
a real SeaweedFS, both databases."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlmodel import func, select

from floom.agent.runner import run_agent
from floom.engine.executor import Executor
from floom.engine.queue import Outcome, claim_next_run, finish_attempt
from floom.sandbox.fake import FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops import end_logs
from floom.services.ops.objects import archive_logs, drain_pending
from floom.services.replays.recordings import load_recording
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs import records
from floom.services.runs.logs import append_events, list_events, system_event
from floom.services.runs.records import RunRecord
from floom.store.agents import ToolCall, Transcript
from floom.store.blobs import logs
from floom.store.blobs.configured import new_blob_store, store_at
from floom.store.blobs.tables import PendingBlob, RunLog
from floom.store.db import session_scope
from floom.store.models import Artifact, Blob, Run, RunEvent
from floom.vocabulary import RunStatus, ToolCallStatus
from tests.integration.store.test_log_moves import _Interleaved
from tests.support.harness import fast_settings, wait_until
from tests.support.processes.s3_server import S3Server
from tests.support.rigs.agents import notes_agent
from tests.support.rigs.queues import enqueue

pytestmark = pytest.mark.usefixtures("bucket_not_away")
BUFFERED = 200
DONE = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})


def _running(ctx: Context, streamed: int, **fields: object) -> Run:
    """A run claimed by this node (its "started" line stored) with `streamed` more lines
    stored, as the flusher writes a longer run's lines while it runs."""
    enqueue(ctx, 1, **fields)
    run = claim_next_run(ctx)
    assert run is not None
    if streamed:
        with session_scope(ctx.engine, write=True) as s:
            append_events(
                s,
                run_id=run.id,
                attempt=1,
                lines=[("stdout", f"streamed {i}", None) for i in range(streamed)],
            )
    return run


def _buffered() -> list[tuple[str, str, None]]:
    return [("stdout", f"buffered {i}", None) for i in range(BUFFERED)]


def _log(ctx: Context, run_id: str, after: int = 0) -> list[tuple[int, str]]:
    return [(e.seq, e.line) for e in list_events(ctx, run_id=run_id, after=after, caller=SYSTEM)]


def _rows(ctx: Context, run_id: str) -> int:
    with session_scope(ctx.engine) as s:
        return int(
            s.exec(
                select(func.count()).select_from(RunEvent).where(RunEvent.run_id == run_id)
            ).one()
        )


def _whole(log: list[tuple[int, str]], streamed: int, *extra: str) -> None:
    """Seqs 1..n without a gap or a repeat: "started", the streamed lines, `extra`, the
    buffered lines, and the closing line."""
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    lines = [line for _, line in log]
    assert lines[0].startswith("started")
    assert lines[1 : 1 + streamed] == [f"streamed {i}" for i in range(streamed)]
    rest = lines[1 + streamed :]
    assert rest[: len(extra)] == list(extra)
    assert rest[len(extra) : -1] == [f"buffered {i}" for i in range(BUFFERED)]
    assert rest[-1].startswith("succeeded")


def _statements(ctx: Context) -> tuple[list[str], Callable[[], None]]:
    sent: list[str] = []

    def note(
        conn: object, cursor: object, statement: str, params: object, context: object, many: bool
    ) -> None:
        sent.append(" ".join(statement.split()).upper())

    event.listen(ctx.engine, "before_cursor_execute", note)
    return sent, lambda: event.remove(ctx.engine, "before_cursor_execute", note)


def test_the_lines_buffered_at_a_run_s_end_go_into_its_object_not_through_run_events(
    s3_ctx: Context,
) -> None:
    run = _running(s3_ctx, 3)
    sent, stop = _statements(s3_ctx)
    try:
        status = finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered())
    finally:
        stop()

    assert status == "succeeded"
    assert not [q for q in sent if q.startswith("INSERT INTO RUN_EVENTS")]
    assert _rows(s3_ctx, run.id) == 0  # the streamed ones left with the end
    with session_scope(s3_ctx.engine) as s:
        archived = s.get(RunLog, run.id)
        assert archived is not None
        blob = s.get(Blob, archived.digest)
        assert blob is not None
        assert blob.location == "s3"
    assert (archived.lines, archived.last_seq) == (1 + 3 + BUFFERED + 1,) * 2
    _whole(_log(s3_ctx, run.id), 3)
    # Nothing left for the upload loop to move.
    assert archive_logs(s3_ctx, run_ids=[run.id]) == 0


def test_a_follower_sees_every_line_once_in_order_across_the_end(s3_ctx: Context) -> None:
    run = _running(s3_ctx, 5)
    # Following while it runs: the stored lines, then nothing new.
    seen = _log(s3_ctx, run.id)
    assert len(seen) == 6
    assert _log(s3_ctx, run.id, after=seen[-1][0]) == []

    finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered())

    # The follower resumes from its cursor (a Last-Event-ID) in the object.
    seen += _log(s3_ctx, run.id, after=seen[-1][0])
    _whole(seen, 5)
    # One that attaches right at the end, and one that pages by 50 from any cursor.
    assert _log(s3_ctx, run.id) == seen
    paged: list[tuple[int, str]] = []
    while page := [
        (e.seq, e.line)
        for e in list_events(
            s3_ctx, run_id=run.id, after=paged[-1][0] if paged else 0, limit=50, caller=SYSTEM
        )
    ]:
        paged += page
    assert paged == seen
    assert _log(s3_ctx, run.id, after=100) == seen[100:]


def test_a_line_stored_between_the_read_and_the_end_keeps_its_place_and_nothing_is_lost(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel request's note (or a late flush) comes while the log uploads: the end's
    transaction finds the run's lines changed and records the end with its lines as rows,
    after that one; the uploaded object is left to be deleted."""
    run = _running(s3_ctx, 2)
    bucket = new_blob_store(s3_ctx.settings, s3_ctx.engine)

    def meanwhile() -> None:
        with session_scope(s3_ctx.engine, write=True) as s:
            system_event(s, run_id=run.id, attempt=1, message="cancel requested")

    store = _Interleaved(bucket, meanwhile)
    monkeypatch.setattr(end_logs, "new_blob_store", lambda settings, engine: store)

    assert finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered()) == (
        "succeeded"
    )

    _whole(_log(s3_ctx, run.id), 2, "cancel requested")
    with session_scope(s3_ctx.engine) as s:
        assert s.get(RunLog, run.id) is None
        pending = s.exec(select(PendingBlob)).all()
    assert [p.action for p in pending] == ["delete"]
    monkeypatch.undo()
    # The upload loop moves the rows later; the abandoned object is deleted.
    assert archive_logs(s3_ctx, run_ids=[run.id]) == 1
    assert drain_pending(s3_ctx).deleted == 1
    assert _rows(s3_ctx, run.id) == 0
    _whole(_log(s3_ctx, run.id), 2, "cancel requested")


def test_an_end_while_the_bucket_is_away_keeps_its_lines_as_rows_until_it_answers(
    tmp_path: Path, database_url: str, own_s3_server: S3Server
) -> None:
    settings = own_s3_server.settings(s3_timeout_seconds=1.0)
    ctx = Context.open(fast_settings(tmp_path / "data", database_url, **settings))
    try:
        first, second = _running(ctx, 1), _running(ctx, 1)
        own_s3_server.stop()
        finish_attempt(ctx, run=first, outcome=DONE, backoff=0, log_lines=_buffered())
        # The next end does not wait for the bucket again.
        finish_attempt(ctx, run=second, outcome=DONE, backoff=0, log_lines=_buffered())
        for run in (first, second):
            assert _rows(ctx, run.id) == 1 + 1 + BUFFERED + 1
            _whole(_log(ctx, run.id), 1)
        own_s3_server.start()
        assert archive_logs(ctx) == 2
        for run in (first, second):
            assert _rows(ctx, run.id) == 0
            _whole(_log(ctx, run.id), 1)
    finally:
        ctx.engine.dispose()


def test_an_end_that_fails_after_its_upload_is_recorded_whole_when_tried_again(
    s3_ctx: Context,
) -> None:
    """The database fails the end's transaction after the object was uploaded (the node's
    executor tries the end again while the database is away): nothing was recorded, the
    lines stored stay rows, and the next try records the whole log once."""
    run = _running(s3_ctx, 4)
    armed = [True]

    def fail_once(
        conn: object, cursor: object, statement: str, params: object, context: object, many: bool
    ) -> None:
        if armed[0] and "run_logs" in statement and "INSERT" in statement.upper():
            armed[0] = False
            raise RuntimeError("the database went away")

    event.listen(s3_ctx.engine, "before_cursor_execute", fail_once)
    try:
        with pytest.raises(RuntimeError):
            finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered())
    finally:
        event.remove(s3_ctx.engine, "before_cursor_execute", fail_once)

    with session_scope(s3_ctx.engine) as s:
        row = s.get(Run, run.id)
        assert row is not None
        assert row.status == RunStatus.RUNNING
        assert s.get(RunLog, run.id) is None
    assert _rows(s3_ctx, run.id) == 1 + 4
    assert finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered()) == (
        "succeeded"
    )
    _whole(_log(s3_ctx, run.id), 4)
    assert _rows(s3_ctx, run.id) == 0


def test_a_line_after_the_end_follows_the_object_and_is_merged_into_a_new_one(
    s3_ctx: Context,
) -> None:
    run = _running(s3_ctx, 0)
    finish_attempt(s3_ctx, run=run, outcome=DONE, backoff=0, log_lines=_buffered())
    with session_scope(s3_ctx.engine, write=True) as s:
        append_events(s, run_id=run.id, attempt=1, lines=[("stdout", "last words", None)])
    log = _log(s3_ctx, run.id)
    assert log[-1] == (len(log), "last words")
    _whole(log[:-1], 0)
    assert archive_logs(s3_ctx) == 1
    assert _rows(s3_ctx, run.id) == 0
    assert _log(s3_ctx, run.id) == log


def _agent_run(ctx: Context, **fields: object) -> tuple[Run, Transcript]:
    """A claimed agent run as its loop leaves it: its transcript saved, two tool calls."""
    run = _running(ctx, 2, **fields)
    transcript = Transcript(
        run_id=run.id,
        worker_name=run.worker_name,
        model="m",
        system="be brief",
        messages_json='[{"role": "user", "content": "hello"}]',
    )
    agent_runs.save_transcript(ctx, transcript)
    for tool in ("write_file", "read_file"):
        agent_runs.record_tool_call(
            ctx, run_id=run.id, attempt=1, tool=tool, arguments={}, status=ToolCallStatus.OK
        )
    return run, transcript


def test_an_agent_run_s_record_goes_into_its_object_in_the_end_s_transaction(
    s3_ctx: Context,
) -> None:
    """The transcript's text and the tool calls leave the database with the run's lines as
    its end is recorded, not in a later move of the upload loop; the record reads back."""
    run, transcript = _agent_run(s3_ctx)
    outcome = Outcome(status=RunStatus.SUCCEEDED, outputs={}, agent=True, transcript=transcript)

    assert finish_attempt(s3_ctx, run=run, outcome=outcome, backoff=0) == "succeeded"

    assert _rows(s3_ctx, run.id) == 0
    with session_scope(s3_ctx.engine) as s:
        row = s.get(Transcript, run.id)
        assert row is not None
        assert row.archived
        assert row.messages_json == ""
        left = s.exec(select(ToolCall).where(ToolCall.run_id == run.id)).all()
    assert left == []
    assert archive_logs(s3_ctx, run_ids=[run.id]) == 0
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert [(c.seq, c.tool) for c in calls] == [(1, "write_file"), (2, "read_file")]
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert (read.system, read.messages_json) == (transcript.system, transcript.messages_json)
    # Read from the bucket, not only from this node's cache.
    logs._cache.clear()
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert read.messages_json == transcript.messages_json
    assert [line for _, line in _log(s3_ctx, run.id)][-1].startswith("succeeded")


def test_an_agent_run_whose_transcript_changed_since_its_loop_saved_it_keeps_it(
    s3_ctx: Context,
) -> None:
    """The loop's copy is not the row (a write after its last save): the row keeps its text
    and the calls their rows; the log still goes into the object."""
    run, transcript = _agent_run(s3_ctx)
    stale = transcript.model_copy()
    transcript.messages_json = '[{"role": "user", "content": "changed"}]'
    agent_runs.save_transcript(s3_ctx, transcript)
    outcome = Outcome(status=RunStatus.SUCCEEDED, outputs={}, agent=True, transcript=stale)

    assert finish_attempt(s3_ctx, run=run, outcome=outcome, backoff=0) == "succeeded"

    assert _rows(s3_ctx, run.id) == 0
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert not read.archived
    assert "changed" in read.messages_json
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert [c.tool for c in calls] == ["write_file", "read_file"]


def _transcript_writes(sent: list[str]) -> list[str]:
    return [q for q in sent if "AGENT_TRANSCRIPTS SET" in q or "INTO AGENT_TRANSCRIPTS" in q]


def _archives(statement: str) -> bool:
    """Whether a write of the transcript row is the end's, which archives it."""
    return "ARCHIVED=" in statement.replace(" ", "")


def _last_step(transcript: Transcript) -> Transcript:
    """The loop's copy after the step that ended its attempt, which it left unsaved."""
    last = transcript.model_copy()
    last.messages_json = json.dumps(
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "done"}]
    )
    last.state_json = '{"pending": []}'
    last.iterations, last.input_tokens, last.active_seconds = 3, 120, 2.5
    return last


def test_an_agent_run_s_unsaved_last_step_is_written_only_by_its_end(s3_ctx: Context) -> None:
    """The step that ended the attempt, left unsaved by its loop, reaches the database once:
    its text goes into the object and the end's one statement writes its figures into the
    row, with no save of the transcript before it."""
    run, transcript = _agent_run(s3_ctx)
    last = _last_step(transcript)
    outcome = Outcome(
        status=RunStatus.SUCCEEDED,
        outputs={},
        agent=True,
        transcript=last,
        transcript_unsaved=True,
    )
    sent, stop = _statements(s3_ctx)
    try:
        assert finish_attempt(s3_ctx, run=run, outcome=outcome, backoff=0) == "succeeded"
    finally:
        stop()

    # One write of the row: the end's, which archives it (on PostgreSQL inside its CTE).
    assert [_archives(q) for q in _transcript_writes(sent)] == [True]
    assert not outcome.transcript_unsaved
    with session_scope(s3_ctx.engine) as s:
        row = s.get(Transcript, run.id)
        assert row is not None
        assert row.archived
        assert (row.iterations, row.input_tokens, row.active_seconds) == (3, 120, 2.5)
    logs._cache.clear()
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert (read.messages_json, read.state_json) == (last.messages_json, last.state_json)
    assert read.iterations == 3


@pytest.mark.parametrize("why", ["retried", "bucket away"])
def test_an_agent_run_s_unsaved_last_step_is_saved_where_no_object_takes_it(
    s3_ctx: Context, s3_server: S3Server, why: str
) -> None:
    """A retry (not an end for good) and an end while the bucket is away record no object:
    the end saves the last step as the loop would have, before its own transaction, so the
    next attempt resumes from it and readers see it."""
    run, transcript = _agent_run(s3_ctx, max_attempts=2)
    last = _last_step(transcript)
    status = RunStatus.FAILED if why == "retried" else RunStatus.SUCCEEDED
    outcome = Outcome(
        status=status, agent=True, transcript=last, transcript_unsaved=True, retryable=True
    )
    if why == "bucket away":
        end_logs._away_until[id(new_blob_store(s3_ctx.settings, s3_ctx.engine))] = 1e18
    ended = finish_attempt(s3_ctx, run=run, outcome=outcome, backoff=0)

    assert ended == ("queued" if why == "retried" else "succeeded")
    assert not outcome.transcript_unsaved
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert not read.archived
    assert (read.messages_json, read.iterations, read.active_seconds) == (
        last.messages_json,
        3,
        2.5,
    )


def test_an_agent_run_on_object_storage_saves_no_step_after_finish_and_replays(
    s3_ctx: Context, tmp_path: Path
) -> None:
    """A whole agent run (the queue, executor, runner and loop real; the model scripted):
    after its finish call is recorded, its transcript is not saved again before the end's
    statement puts it into the object; the run's recording (what a replay reads: transcript
    and tool calls) reads back from the object."""
    notes_agent(s3_ctx, tmp_path / "agent")
    executor = Executor(s3_ctx, FakeSandbox({}), run_agent=run_agent)
    executor.start()
    sent, stop = _statements(s3_ctx)
    try:
        run_id = runs.create_run(s3_ctx, caller=SYSTEM, worker_name="agent", inputs={}).id
        done = wait_until(
            lambda: (r := runs.get_run(s3_ctx, caller=SYSTEM, run_id=run_id)).finished_at and r
        )
    finally:
        stop()
        executor.stop(grace_seconds=2)

    assert done.status == "succeeded"
    finish_recorded = max(i for i, q in enumerate(sent) if q.startswith("INSERT INTO TOOL_CALLS"))
    assert [_archives(q) for q in _transcript_writes(sent[finish_recorded:])] == [True]
    logs._cache.clear()
    recording = load_recording(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [c.name for c in recording.calls] == ["write_file", "read_file"]  # answered ones
    assert "notes notes" in recording.calls[1].content
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [c.tool for c in calls] == ["write_file", "read_file", "finish"]
    assert recording.turn_usage is not None
    assert len(recording.turn_usage) == 3
    with session_scope(s3_ctx.engine) as s:
        row = s.get(Transcript, run_id)
        assert row is not None
        assert row.archived
        assert row.iterations == 3
        assert row.active_seconds > 0


def _shape(statement: str) -> str:
    """A statement's verb and the tables it names, sorted ("SELECT RUN_EVENTS RUN_LOGS")."""
    tables = set(re.findall(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+\"?(\w+)", statement)) - {"SET"}
    return " ".join([statement.split(None, 1)[0], *sorted(tables)])


def test_an_agent_run_s_end_on_object_storage_reads_once_and_records_its_objects_in_one_statement(
    s3_ctx: Context,
) -> None:
    """The end of an agent run with an artifact: its lines and its tool calls are read by
    one query, and on PostgreSQL the artifact's blob row and its artifacts row are written
    by the statement that records the log's (no INSERT of their own); everything reads
    back."""
    run, transcript = _agent_run(s3_ctx)
    outcome = Outcome(
        status=RunStatus.SUCCEEDED,
        outputs={},
        agent=True,
        transcript=transcript,
        artifacts=[("notes.md", b"notes " * 500, "text/markdown")],
    )
    sent, stop = _statements(s3_ctx)
    try:
        assert finish_attempt(s3_ctx, run=run, outcome=outcome, backoff=0) == "succeeded"
    finally:
        stop()

    shapes = [_shape(q) for q in sent if q != "BEGIN"]
    reads = [q for q in shapes if q.startswith("SELECT") and "TOOL_CALLS" in q]
    assert reads == ["SELECT RUN_EVENTS RUN_LOGS TOOL_CALLS"], shapes
    if s3_ctx.engine.dialect.name == "postgresql":
        assert shapes == [
            "SELECT RUN_EVENTS RUN_LOGS TOOL_CALLS",  # the log and the calls
            "SELECT",  # the run's event lock
            "UPDATE RUNS",
            # the artifact's row too (no INSERT of its own)
            "WITH AGENT_TRANSCRIPTS ARTIFACTS BLOBS EMPTIED END_ARTIFACTS END_LINES_GONE "
            "RUN_EVENTS RUN_LOGS TOOL_CALLS",
        ], shapes
    assert _rows(s3_ctx, run.id) == 0
    with session_scope(s3_ctx.engine) as s:
        (artifact,) = s.exec(select(Artifact).where(Artifact.run_id == run.id)).all()
        blob = s.get(Blob, artifact.digest)
        assert blob is not None
        assert blob.location == "s3"
    kept = store_at("s3", s3_ctx.settings, s3_ctx.engine).get(
        artifact.digest, sha256=blob.sha256, what="the artifact", size=blob.size
    )
    assert kept == b"notes " * 500
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert [(c.seq, c.tool) for c in calls] == [(1, "write_file"), (2, "read_file")]
    logs._cache.clear()
    read = agent_runs.load_transcript(s3_ctx, run_id=run.id, caller=SYSTEM)
    assert read is not None
    assert read.messages_json == transcript.messages_json


def test_an_end_s_artifacts_reach_its_waiter_with_the_ids_and_names_stored(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record handed to a waiter of an agent run's end names each artifact with the id
    its row was stored under (on PostgreSQL they are written by the log's statement, which
    returns their ids), whatever the order of their names in the database's collation."""
    run, transcript = _agent_run(s3_ctx)
    # The rig's runs name no deployed version; the record's approvals are not the point.
    monkeypatch.setattr(records, "may_have_approvals", lambda ctx, run: False)
    names = ["b.md", "B.md", "a.md", "_z.md"]
    outcome = Outcome(
        status=RunStatus.SUCCEEDED,
        outputs={},
        agent=True,
        transcript=transcript,
        artifacts=[(name, f"{name} ".encode() * 100, "text/markdown") for name in names],
    )

    async def waited() -> object:
        with s3_ctx.node.run_ends.listening(run.id, reader=lambda record: record) as woken:
            ended = await asyncio.to_thread(
                finish_attempt, s3_ctx, run=run, outcome=outcome, backoff=0
            )
            assert ended == "succeeded"
            await woken.wait(30)
            return woken.take()

    record = asyncio.run(waited())
    assert isinstance(record, RunRecord)
    with session_scope(s3_ctx.engine) as s:
        stored = s.exec(select(Artifact).where(Artifact.run_id == run.id)).all()
    assert sorted(a.name for a in stored) == sorted(names)
    assert [a.model_dump() for a in record.artifacts] == [
        a.model_dump() for a in sorted(stored, key=lambda a: a.name)
    ]
