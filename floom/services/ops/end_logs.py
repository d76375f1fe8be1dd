"""A run's log put into its object as its end is recorded (FLOOM_BLOB_STORE=s3): the lines
still buffered at the end never pass through run_events, and the lines streamed before leave
it in the very transaction that records the end (engine/queue.finish_attempt).

The object is uploaded before that transaction (as an attempt's artifacts are), so an end
that is recorded names a log that is already durable, and an end that is not (the node
stopped, the database away) loses nothing the buffered lines did not lose before; such an
object, which no row names, is deleted by retention's sweep (objects.sweep_objects). An
agent run's record (its transcript's text and tool calls) goes into the same object, and
leaves the database in the same transaction. The lines and tool calls stored so far are
taken from the copy the attempt's node kept of them when it has one (KeptLog), else read
back. When the bucket is away or the run's lines change between the read (or the copy) and
the end, the end is recorded as before: its lines as rows of run_events, which
engine/loops/uploads.py moves later (with an agent run's record); a copy's change is first
tried again with the lines read back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, cast, delete, func, insert, literal, null, union_all
from sqlalchemy import select as core_select
from sqlmodel import col

from floom.errors import BlobStoreUnavailable, Conflict
from floom.services.ops.objects import LogMove, record_moves
from floom.services.runs import agent as agent_runs
from floom.store.agents import ToolCall, Transcript
from floom.store.blobs.base import sha256_of
from floom.store.blobs.configured import new_blob_store
from floom.store.blobs.logs import encode_log
from floom.store.blobs.rows import DATABASE, DELETE, StagedBlob
from floom.store.blobs.tables import PendingBlob, RunLog
from floom.store.db import Writer, on_postgres, read_connection
from floom.store.models import Artifact, Run, RunEvent, trusted_row, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.blobs")

LogLine = tuple[str, str, datetime | None]

# After the bucket refused a log at a run's end, ends record their lines as rows for this
# long (the upload loop moves them once it answers) instead of each waiting out the
# client's timeout and retries.
AWAY_SECONDS = 10.0


class LogChanged(Conflict):
    """The run's lines in run_events are not those read before its end (a line appended
    meanwhile: a cancel request, a late flush): the end's transaction is rolled back and
    recorded again with its lines as rows."""


@dataclass(frozen=True)
class KeptLog:
    """A run's lines in run_events (in seq order, from seq 1) and its tool calls, as the
    node running its attempt wrote them and kept a copy (engine/runlog.RunLog): its end
    uploads them instead of reading them back. Only the lines' count is known to hold: a
    line another writer stored meanwhile is missing here, and record_end_log's count of the
    lines it deletes refuses the copy then (LogChanged)."""

    events: Sequence[RunEvent]
    calls: Sequence[ToolCall]


@dataclass(frozen=True)
class EndLog:
    """A run's whole log (and an agent run's record) in an object already uploaded, for the
    transaction that records the run's end; `kept`: made from a KeptLog, not read back."""

    move: LogMove
    kept: bool = False

    @property
    def digest(self) -> str:
        return self.move.blob.digest


def stage_end_log(
    ctx: Context,
    *,
    run: Run,
    closing: Sequence[LogLine],
    now: datetime,
    transcript: Transcript | None = None,
    kept: KeptLog | None = None,
) -> EndLog | None:
    """Read the run's lines in run_events, add `closing` (its last lines, which the end's
    transaction would append) after them, and upload the whole log as its object; for an
    agent run (`transcript`: as its loop last saved it), with its record (the transcript's
    text and its tool calls, read with its lines). With `kept`, its lines and tool calls
    are taken from that copy instead of read back. None when new blobs go to the database,
    the bucket is away, or the run has no line stored yet or a log object already (its end
    then records its lines as rows). Call it outside any transaction."""
    store = new_blob_store(ctx.settings, ctx.engine)
    if store.inline or time.monotonic() < _away_until.get(id(store), 0.0):
        return None
    if kept is not None and kept.events:
        events = list(kept.events)
        calls = list(kept.calls) if transcript is not None else []
    else:
        kept = None
        events, calls = _read_log(ctx, run.id, agent=transcript is not None)
    if not events:
        return None
    last = events[-1].seq
    lines = events + [
        trusted_row(
            RunEvent,
            {
                "run_id": run.id,
                "seq": last + n,
                "attempt": run.attempt,
                "ts": ts or now,
                "stream": stream,
                "line": line,
            },
        )
        for n, (stream, line, ts) in enumerate(closing, 1)
    ]
    record = agent_runs.archive_record(transcript, calls) if transcript is not None else None
    data = encode_log(lines, record)
    sha = sha256_of(data)
    try:
        store.put(sha, data, sha256=sha)
    except BlobStoreUnavailable as exc:
        _away_until[id(store)] = time.monotonic() + AWAY_SECONDS
        log.warning(
            "the log of run %s stays in the database until the object store is back: %s",
            run.id,
            exc.message,
        )
        return None
    except Exception:  # the object only spares the rows: whatever fails, the end keeps them
        log.exception("the log of run %s stays in the database: its upload failed", run.id)
        return None
    return EndLog(
        LogMove(
            RunLog(run_id=run.id, digest=sha, lines=len(lines), last_seq=lines[-1].seq),
            StagedBlob(sha, len(data), sha, store.name, b""),
            read=(len(events), last),
            earlier=None,
            transcript=transcript,
            call_ids=[c.id for c in calls],
        ),
        kept=kept is not None,
    )


def _read_log(ctx: Context, run_id: str, *, agent: bool) -> tuple[list[RunEvent], list[ToolCall]]:
    """The run's lines in run_events, in order, and for an agent run its tool calls; no lines
    when the run has a log object already (its end then appends rows, which the upload loop
    merges). Whether it has one is asked beside its lines (once, not once per line), and an
    agent run's tool calls come in the same query (UNION ALL, each side's columns NULL on
    the other's rows): one round trip, where a read of its own cost one a run.

    An agent run's transcript is not read: its loop's copy is the row (checked by its
    updated_at as the end records it: agent.record_archived). Its record used to move with
    its log in the upload loop, half a second after its end (gathered with other runs'),
    which cost four reads and a transaction of its own beside this end's."""
    query, events_of, calls_of = _log_query(agent)
    events: list[RunEvent] = []
    calls: list[ToolCall] = []
    with read_connection(ctx.engine) as c:
        for row in c.execute(query, {"run_id": run_id}):
            if row.earlier is not None:
                return [], []
            if row.is_call:
                calls.append(trusted_row(ToolCall, calls_of(row)))
            else:
                events.append(trusted_row(RunEvent, events_of(row)))
    if not events:
        return [], []
    events.sort(key=attrgetter("seq"))
    calls.sort(key=attrgetter("seq"))
    return events, calls


@lru_cache(maxsize=2)
def _log_query(
    agent: bool,
) -> tuple[Any, Callable[[Any], dict[str, Any]], Callable[[Any], dict[str, Any]]]:
    """_read_log's query (built once: building it costs more than running it), and how to
    take a run_events row and a tool_calls row out of one of its result rows."""
    events_t, logs_t = RunEvent.__table__, RunLog.__table__  # type: ignore[attr-defined]
    calls_t = ToolCall.__table__  # type: ignore[attr-defined]
    run_id: Any = bindparam("run_id")
    line_names = [column.name for column in events_t.c if column.name != "id"]
    call_names = [column.name for column in calls_t.c] if agent else []
    earlier = core_select(logs_t.c.digest).where(logs_t.c.run_id == run_id).scalar_subquery()

    lines = core_select(
        literal(False).label("is_call"),
        *(events_t.c[n].label("e_" + n) for n in line_names),
        *(cast(null(), calls_t.c[n].type).label("c_" + n) for n in call_names),
        earlier.label("earlier"),
    ).where(events_t.c.run_id == run_id)
    query: Any = lines
    if agent:
        query = union_all(
            lines,
            core_select(
                literal(True).label("is_call"),
                *(cast(null(), events_t.c[n].type).label("e_" + n) for n in line_names),
                *(calls_t.c[n].label("c_" + n) for n in call_names),
                null().label("earlier"),
            ).where(calls_t.c.run_id == run_id),
        )

    def events_of(row: Any) -> dict[str, Any]:
        return {n: row._mapping["e_" + n] for n in line_names}

    def calls_of(row: Any) -> dict[str, Any]:
        return {n: row._mapping["c_" + n] for n in call_names}

    return query, events_of, calls_of


def record_end_log(
    s: Writer,
    end_log: EndLog,
    *,
    blobs: Sequence[StagedBlob] = (),
    artifacts: Sequence[dict[str, Any]] = (),
) -> dict[str, int]:
    """In the transaction that records the run's end, holding the run's event lock
    (logs.lock_events): its lines leave run_events and its object is recorded as its log,
    with the rows of `blobs` (the end's artifacts, already in the bucket: on PostgreSQL in
    the same statement). Raises LogChanged when the lines there are not those read (the
    caller rolls back).

    `artifacts`: the end's artifacts rows (by `artifacts_folded`, on PostgreSQL only, when
    every one names a blob of `blobs`), inserted by the same statement, where their INSERT
    cost a statement and a round trip of its own; their ids are returned by name."""
    move = end_log.move
    run_id = move.archive.run_id
    # Every line of the run, not only those up to the last seq read: a line appended since
    # would sit between the read ones and the closing ones the object numbers after them.
    gone = delete(RunEvent).where(col(RunEvent.run_id) == run_id).returning(col(RunEvent.seq))
    ids: dict[str, int] = {}
    if on_postgres(s):
        cte = gone.cte("end_lines_gone")
        extra: list[Any] = [cte]
        returning: list[Any] = [
            core_select(func.count()).select_from(cte).scalar_subquery(),
            core_select(func.coalesce(func.max(cte.c.seq), 0)).scalar_subquery(),
        ]
        if artifacts:
            table = Artifact.__table__  # type: ignore[attr-defined]
            stored = (
                insert(table)
                .values(list(artifacts))
                .returning(table.c.id, table.c.name)
                .cte("end_artifacts")
            )
            extra.append(stored)
            returning.append(
                core_select(func.json_object_agg(stored.c.name, stored.c.id)).scalar_subquery()
            )
        found = record_moves(s, [move], blobs=blobs, extra=extra, returning=returning).first()
        read = (int(found[0]), int(found[1]))
        if artifacts:
            ids = {str(name): int(id_) for name, id_ in found[2].items()}
    else:
        if artifacts:
            raise ValueError("artifacts are folded into the end's statement on PostgreSQL only")
        seqs = [seq for (seq,) in s.execute(gone)]
        read = (len(seqs), max(seqs, default=0))
        if read == move.read:
            record_moves(s, [move], blobs=blobs)
    if read != move.read:
        raise LogChanged(f"the log of run {run_id} changed before its end was recorded")
    return ids


def artifacts_folded(s: Writer, end_log: EndLog | None, staged: int, blobs: int) -> bool:
    """Whether the end's `staged` artifacts go into record_end_log's statement: on
    PostgreSQL, with the log in an object, when all of them are among its `blobs` (their
    bytes in the bucket already)."""
    return end_log is not None and staged > 0 and staged == blobs and on_postgres(s)


def abandon_end_log(s: Writer, end_log: EndLog) -> None:
    """The run's end is recorded without its staged object (its lines as rows): the object
    is deleted once this transaction commits, unless a blob row names its digest by then
    (services/ops/objects.py checks before it deletes)."""
    if end_log.move.blob.location == DATABASE:
        return
    pending = PendingBlob.__table__  # type: ignore[attr-defined]
    if on_postgres(s):
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    s.execute(
        upsert(pending)
        .values(digest=end_log.digest, action=DELETE, created_at=utcnow(), attempts=0)
        .on_conflict_do_nothing(index_elements=["digest"])
    )


# By store (the node's stores are made once per configuration, configured.s3_store).
_away_until: dict[int, float] = {}
