"""Moving an ended run's log into object storage (services/ops/objects.archive_logs) while
others write: lines that arrive during the move stay rows for the next pass, and a run whose
lines another node moved meanwhile is left alone; either way the log reads back whole, in
order, with no line twice. The interleavings are made inside the object store's put (the
step between the move's read and its write), on a real SeaweedFS."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import event
from sqlmodel import func, select

from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops.objects import archive_logs
from floom.services.runs import agent as agent_runs
from floom.services.runs.logs import append_events, list_events
from floom.store.agents import ToolCall, Transcript
from floom.store.blobs.base import BlobStore, Finding
from floom.store.blobs.configured import new_blob_store
from floom.store.blobs.tables import RunLog
from floom.store.db import session_scope
from floom.store.models import Run, RunEvent, new_id
from floom.vocabulary import RunStatus, ToolCallStatus


class _Interleaved(BlobStore):
    """The node's bucket, running `meanwhile` once, after the first put."""

    name = "s3"
    inline = False

    def __init__(self, inner: BlobStore, meanwhile: Callable[[], None]) -> None:
        self.inner, self.meanwhile = inner, meanwhile

    def put(self, digest: str, data: bytes, *, sha256: str) -> None:
        self.inner.put(digest, data, sha256=sha256)
        meanwhile, self.meanwhile = self.meanwhile, lambda: None
        meanwhile()

    def get(self, digest: str, *, sha256: str | None, what: str, size: int | None = None) -> bytes:
        return self.inner.get(digest, sha256=sha256, what=what, size=size)

    def delete(self, digests: Sequence[str]) -> None:
        self.inner.delete(digests)

    def describe(self, digest: str) -> str:
        return self.inner.describe(digest)

    def check(self) -> list[Finding]:
        return self.inner.check()


def _ended_run(ctx: Context, lines: int) -> str:
    run_id = new_id("run")
    with session_scope(ctx.engine, write=True) as s:
        s.add(Run(id=run_id, worker_name="w", version_id="v", status=RunStatus.SUCCEEDED))
        s.flush()
        append_events(
            s,
            run_id=run_id,
            attempt=1,
            lines=[("stdout", f"line {i}", None) for i in range(lines)],
            first=True,
        )
    return run_id


def _append(ctx: Context, run_id: str, line: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        append_events(s, run_id=run_id, attempt=1, lines=[("stdout", line, None)])


def _rows(ctx: Context, run_id: str) -> int:
    with session_scope(ctx.engine) as s:
        return int(
            s.exec(
                select(func.count()).select_from(RunEvent).where(RunEvent.run_id == run_id)
            ).one()
        )


def _log(ctx: Context, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.line) for e in list_events(ctx, run_id=run_id, caller=SYSTEM)]


def test_a_line_that_comes_during_the_move_stays_a_row_and_the_next_pass_merges_it(
    s3_ctx: Context,
) -> None:
    run_id = _ended_run(s3_ctx, 5)
    store = _Interleaved(
        new_blob_store(s3_ctx.settings, s3_ctx.engine),
        lambda: _append(s3_ctx, run_id, "last words"),
    )

    assert archive_logs(s3_ctx, run_ids=[run_id], store=store) == 1

    assert _rows(s3_ctx, run_id) == 1  # the late line, seq 6
    expected = [(i + 1, f"line {i}") for i in range(5)] + [(6, "last words")]
    assert _log(s3_ctx, run_id) == expected
    assert archive_logs(s3_ctx, run_ids=[run_id]) == 1
    assert _rows(s3_ctx, run_id) == 0
    with session_scope(s3_ctx.engine) as s:
        archived = s.get(RunLog, run_id)
        assert archived is not None
        assert (archived.lines, archived.last_seq) == (6, 6)
    assert _log(s3_ctx, run_id) == expected


def test_a_run_whose_lines_another_node_moved_meanwhile_is_left_alone(s3_ctx: Context) -> None:
    run_id = _ended_run(s3_ctx, 5)
    other = _ended_run(s3_ctx, 3)
    bucket = new_blob_store(s3_ctx.settings, s3_ctx.engine)
    moved_elsewhere: list[int] = []

    def another_node() -> None:
        # It moves the same log, then a late line comes and it moves that too.
        moved_elsewhere.append(archive_logs(s3_ctx, run_ids=[run_id], store=bucket))
        _append(s3_ctx, run_id, "last words")
        moved_elsewhere.append(archive_logs(s3_ctx, run_ids=[run_id], store=bucket))

    store = _Interleaved(bucket, another_node)

    # This pass read both runs; the first one's lines went meanwhile: only the other moves.
    assert archive_logs(s3_ctx, run_ids=[run_id, other], store=store) == 1
    assert moved_elsewhere == [1, 1]

    assert (_rows(s3_ctx, run_id), _rows(s3_ctx, other)) == (0, 0)
    assert _log(s3_ctx, run_id) == [(i + 1, f"line {i}") for i in range(5)] + [(6, "last words")]
    assert _log(s3_ctx, other) == [(i + 1, f"line {i}") for i in range(3)]
    with session_scope(s3_ctx.engine) as s:
        archived = s.get(RunLog, run_id)
        assert archived is not None
        assert archived.last_seq == 6


def test_a_batch_of_lines_is_one_insert_on_postgresql_with_seqs_in_order(ctx: Context) -> None:
    """One statement per batch, which reads the run's last seq once (a lookup per line cost
    PostgreSQL a scan of run_events each where its plan for a table that looked empty was
    one); the seqs follow on from the lines already there."""
    run_id = _ended_run(ctx, 3)
    sent: list[str] = []

    def count(
        conn: object, cursor: object, statement: str, params: object, context: object, many: bool
    ) -> None:
        # An executemany is one statement per row of parameters for PostgreSQL.
        sent.extend([statement] * (len(params) if many and isinstance(params, list) else 1))

    event.listen(ctx.engine, "before_cursor_execute", count)
    try:
        with session_scope(ctx.engine, write=True) as s:
            append_events(
                s,
                run_id=run_id,
                attempt=1,
                lines=[("stdout", f"more {i}", None) for i in range(50)],
            )
    finally:
        event.remove(ctx.engine, "before_cursor_execute", count)

    inserts = [q for q in sent if q.lstrip().upper().startswith("INSERT")]
    if ctx.engine.dialect.name == "postgresql":
        assert len(inserts) == 1
    expected = [(i + 1, f"line {i}") for i in range(3)]
    expected += [(i + 4, f"more {i}") for i in range(50)]
    assert _log(ctx, run_id) == expected


def _call(ctx: Context, run_id: str, tool: str) -> None:
    agent_runs.record_tool_call(
        ctx, run_id=run_id, attempt=1, tool=tool, arguments={}, status=ToolCallStatus.OK
    )


def test_a_tool_call_recorded_during_the_move_is_listed_after_the_moved_ones(
    s3_ctx: Context,
) -> None:
    """A stopped attempt's call that read the run's last seq before the record moved stays a
    row beside the archived record; listing merges them, none hidden, in seq order."""
    run_id = _ended_run(s3_ctx, 2)
    with session_scope(s3_ctx.engine, write=True) as s:
        s.add(Transcript(run_id=run_id, worker_name="w", model="m", messages_json="[1]"))
    _call(s3_ctx, run_id, "first")
    _call(s3_ctx, run_id, "second")
    store = _Interleaved(
        new_blob_store(s3_ctx.settings, s3_ctx.engine), lambda: _call(s3_ctx, run_id, "late")
    )

    assert archive_logs(s3_ctx, run_ids=[run_id], store=store) == 1

    with session_scope(s3_ctx.engine) as s:
        transcript = s.get(Transcript, run_id)
        assert transcript is not None
        assert transcript.archived
        rows = s.exec(select(ToolCall.tool).where(ToolCall.run_id == run_id)).all()
        assert rows == ["late"]
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [(c.seq, c.tool) for c in calls] == [(1, "first"), (2, "second"), (3, "late")]
    # After the move, a call is dropped: its seq would start again at 1.
    _call(s3_ctx, run_id, "later")
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [c.tool for c in calls] == ["first", "second", "late"]


def test_a_move_by_another_node_between_the_reads_of_a_move_loses_no_line(
    s3_ctx: Context,
) -> None:
    """The move reads a run's lines and its earlier log in two statements (two snapshots on
    PostgreSQL). Another node moving the lines between them, and a late line after that,
    must leave the log whole: the lines are read first, so the move either finds the other
    blob or its write finds the lines gone."""
    run_id = _ended_run(s3_ctx, 5)
    bucket = new_blob_store(s3_ctx.settings, s3_ctx.engine)
    armed = [True]

    def between(
        conn: object, cursor: object, statement: str, params: object, context: object, many: bool
    ) -> None:
        if armed[0] and statement.lstrip().upper().startswith("SELECT"):
            armed[0] = False
            assert archive_logs(s3_ctx, run_ids=[run_id], store=bucket) == 1
            _append(s3_ctx, run_id, "last words")

    event.listen(s3_ctx.engine, "after_cursor_execute", between)
    try:
        archive_logs(s3_ctx, run_ids=[run_id], store=bucket)
    finally:
        event.remove(s3_ctx.engine, "after_cursor_execute", between)

    assert not armed[0]
    expected = [(i + 1, f"line {i}") for i in range(5)] + [(6, "last words")]
    assert _log(s3_ctx, run_id) == expected
    archive_logs(s3_ctx, run_ids=[run_id])
    assert _rows(s3_ctx, run_id) == 0
    assert _log(s3_ctx, run_id) == expected
