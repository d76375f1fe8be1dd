"""Blobs and the object store: ended runs' logs moved out of run_events into one blob each,
the store's pending uploads and deletes done once it answers, `floom blobs migrate` between
the database and a bucket, and `floom blobs check`.

Every step is idempotent and resumable: each blob or batch of runs commits on its own, and a
step that the object store interrupts leaves the rest as it was, for the next pass.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import lru_cache
from itertools import groupby
from operator import attrgetter
from time import monotonic
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import delete, func, or_, text, update
from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from floom.cut import cut
from floom.errors import BlobStoreUnavailable, BlobUnreadable, InvalidRequest
from floom.invisible import shown
from floom.services.runs import agent as agent_runs
from floom.services.runs import rules as run_rules
from floom.store.agents import ToolCall, Transcript
from floom.store.blobs.base import BlobStore, sha256_of, vouched_sha256
from floom.store.blobs.configured import new_blob_store, store_at
from floom.store.blobs.logs import decode_log, decode_record, encode_log
from floom.store.blobs.rows import (
    DATABASE,
    DELETE,
    UPLOAD,
    StagedBlob,
    delete_unreferenced_blobs,
    insert_blob,
    read_blob,
)
from floom.store.blobs.s3 import S3BlobStore
from floom.store.blobs.tables import HeldBack, PendingBlob, RunLog
from floom.store.db import Writer, on_postgres, read_connection, session_scope, write_connection
from floom.store.models import Artifact, Blob, Run, RunEvent, Version, trusted_row, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.blobs")

# Runs whose logs one pass moves per transaction, and pending items per pass.
LOG_BATCH = 50
PENDING_BATCH = 100
# Blobs `floom blobs migrate` and `floom blobs check` read per query of the blobs table.
WALK_CHUNK = 100
_FINISHED = sorted(run_rules.FINISHED)

Progress = Callable[[str], None]


def archive_logs(
    ctx: Context,
    *,
    run_ids: Sequence[str] | None = None,
    store: BlobStore | None = None,
    limit: int = LOG_BATCH,
    passed_over: dict[str, BlobProblem] | None = None,
) -> int:
    """Move the logs of up to `limit` ended runs (of `run_ids`, or any that still has lines
    in run_events) into one blob each in `store` (default: where new blobs go; nothing moves
    while that is the database). An agent run's record (its transcript's text and its tool
    calls) moves into the same blob (floom/store/blobs/logs.py). Lines that came after an
    earlier move (a cancelled attempt's last words) are merged into a new blob. Returns how
    many runs' logs moved; raises BlobStoreUnavailable, changing nothing more, when the store
    is away.

    A run whose earlier log is missing or damaged (BlobUnreadable) cannot be merged: its
    lines stay in run_events and its earlier blob stays as it is (to be restored), it is
    added to `passed_over` (run id -> the problem), logged, and not chosen again by a pass
    given the same dict; the other runs move. Callers that loop until nothing moves go on
    while `passed_over` grows (archive_all_logs)."""
    store = store or new_blob_store(ctx.settings, ctx.engine)
    if store.inline:
        return 0
    if passed_over is None:
        passed_over = {}
    chosen, events, transcripts, calls = _read_ended(
        ctx, run_ids=run_ids, limit=limit, exclude=set(passed_over)
    )
    moves: list[LogMove] = []
    for run_id, group in groupby(events, key=lambda e: e.run_id):
        lines = list(group)
        read = (len(lines), lines[-1].seq)
        earlier = chosen.get(run_id)
        transcript = transcripts.get(run_id)
        run_calls = calls.get(run_id, [])
        record = agent_runs.archive_record(transcript, run_calls) if transcript else None
        if earlier is not None:
            try:
                old = read_blob(ctx.settings, ctx.engine, earlier, what=f"the log of run {run_id}")
                if record is None:
                    record = decode_record(run_id, earlier, old)
                earlier_lines = decode_log(run_id, earlier, old)
            except BlobUnreadable as exc:
                passed_over[run_id] = _unmerged(ctx, run_id, earlier, exc)
                continue
            lines = [e for e in earlier_lines if e.seq < lines[0].seq] + lines
        data = encode_log(lines, record)
        sha = sha256_of(data)
        store.put(sha, data, sha256=sha)
        moves.append(
            LogMove(
                RunLog(run_id=run_id, digest=sha, lines=len(lines), last_seq=lines[-1].seq),
                StagedBlob(sha, len(data), sha, store.name, b""),
                read=read,
                earlier=earlier,
                transcript=transcript,
                call_ids=[c.id for c in run_calls],
            )
        )
    return _record_archives(ctx, moves)


def archive_all_logs(
    ctx: Context,
    *,
    store: BlobStore | None = None,
    passed_over: dict[str, BlobProblem],
    stopping: Callable[[], bool] = lambda: False,
    progress: Progress | None = None,
) -> int:
    """archive_logs pass after pass until no ended run's log is left to move (those passed
    over stay, listed in `passed_over`); returns how many moved."""
    moved = 0
    while not stopping():
        seen = len(passed_over)
        now = archive_logs(ctx, store=store, passed_over=passed_over)
        if not now and len(passed_over) == seen:
            break
        moved += now
        if progress and now:
            progress(f"{moved} ended run log(s) moved")
    return moved


def _unmerged(ctx: Context, run_id: str, digest: str, exc: BlobUnreadable) -> BlobProblem:
    """The problem of a run whose later lines cannot be merged with its unreadable earlier
    log: recorded in held_back_logs (counted by /healthz, /metrics and `floom
    doctor`, listed by `floom blobs held-back`) the first time a pass meets it, and said in
    floom's log the first time this process meets it, then at most once per
    HELD_BACK_LOG_SECONDS with how many passes met it since (every sweep of every node meets
    it until the object is restored or the earlier log given up)."""
    problem = (
        f"{exc.message}; the run's later lines stay in the database until it is restored "
        "(its log is not moved)"
    )
    with session_scope(ctx.engine) as s:
        location = s.exec(select(Blob.location).where(Blob.digest == digest)).first()
        marked = s.exec(
            select(HeldBack.digest).where(HeldBack.run_id == run_id, HeldBack.digest == digest)
        ).first()
    if marked is None:
        _mark_held_back(ctx, run_id, digest, problem)
    now = monotonic()
    with _held_back_lock:
        said = _held_back_said.get((run_id, digest))
        passes = said[1] if said else 0
        due = said is None or now - said[0] >= HELD_BACK_LOG_SECONDS
        _held_back_said[(run_id, digest)] = (now, 0) if due or not said else (said[0], passes + 1)
    if due:
        since = f" (passed over {passes} more time(s) since it was last said)" if passes else ""
        log.error("run %s: %s%s", run_id, problem, since)
    return BlobProblem(digest, location or "", problem)


def _mark_held_back(ctx: Context, run_id: str, digest: str, problem: str) -> None:
    """Record (or, for a newer earlier log, replace) run `run_id`'s held_back_logs row; two
    nodes' passes meeting it at once write it once."""
    held = HeldBack.__table__  # type: ignore[attr-defined]
    with write_connection(ctx.engine) as c:
        if on_postgres(c):
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        values = {
            "run_id": run_id,
            "digest": digest,
            "problem": cut(problem, HELD_BACK_CHARS),
            "since": utcnow(),
        }
        statement = insert(held).values(values)
        c.execute(
            statement.on_conflict_do_update(
                index_elements=["run_id"],
                set_={k: statement.excluded[k] for k in ("digest", "problem", "since")},
            )
        )


# How often this process says again that a run's log is held back (see _unmerged), and
# when it last said it of each (run, earlier log) with the passes since.
HELD_BACK_LOG_SECONDS = 3600.0
_held_back_lock = threading.Lock()
_held_back_said: dict[tuple[str, str], tuple[float, int]] = {}
# What held_back_logs keeps of why a run's log is held back.
HELD_BACK_CHARS = 1000


@dataclass
class LogMove:
    """One run's log (and agent record) made a blob, for _record_archives to record."""

    archive: RunLog
    blob: StagedBlob
    # The run's lines read from run_events: how many, and the last seq.
    read: tuple[int, int]
    earlier: str | None
    # The agent run's transcript row as read, and its tool calls' ids, moved into the blob.
    transcript: Transcript | None
    call_ids: list[str]


def _read_ended(
    ctx: Context, *, run_ids: Sequence[str] | None, limit: int, exclude: set[str]
) -> tuple[dict[str, str | None], list[RunEvent], dict[str, Transcript], dict[str, list[ToolCall]]]:
    """Up to `limit` ended runs with lines in run_events (the first `limit` of `run_ids` if given),
    none of `exclude`, each with the digest of its earlier log blob if one was recorded; their
    lines in order; the transcripts (not moved yet) and tool calls of the agent runs among them.
    Two queries for runs that are not agent runs (and one more to find the runs when none are
    given). Plain reads (read_connection): the write of the move checks that the lines read are
    all still there.

    The runs are named by id in each query, so that PostgreSQL finds them and their lines
    through the primary key and the (run_id, seq) index: given a subquery, it scanned the
    whole of run_events, which the moves leave full of dead rows until a vacuum, or all the
    ended runs."""
    runs, events_t = Run.__table__, RunEvent.__table__  # type: ignore[attr-defined]
    logs_t, transcripts_t = RunLog.__table__, Transcript.__table__  # type: ignore[attr-defined]
    with read_connection(ctx.engine) as c:
        if run_ids is None:
            with_lines = core_select(events_t.c.run_id).distinct()
            ended = core_select(runs.c.id).where(
                runs.c.id.in_(with_lines), runs.c.status.in_(_FINISHED)
            )
            if exclude:
                ended = ended.where(runs.c.id.not_in(sorted(exclude)))
            run_ids = list(c.execute(ended.limit(limit)).scalars())
        wanted = sorted(set(run_ids) - exclude)[:limit]
        if not wanted:
            return {}, [], {}, {}
        # The lines, then one row per run (joined to each line, the run's own rows were
        # looked up once per line). In this order: a move by another node that committed
        # before the lines were read shows in the earlier log read after them, and one that
        # took the lines read is found by the write (_record_archives).
        names = [column.name for column in events_t.c if column.name != "id"]
        lines = (
            core_select(*(events_t.c[n] for n in names))
            .select_from(events_t.join(runs, runs.c.id == events_t.c.run_id))
            .where(
                events_t.c.run_id.in_(wanted),
                runs.c.id.in_(wanted),
                runs.c.status.in_(_FINISHED),
            )
        )
        chosen: dict[str, str | None] = {}
        events: list[RunEvent] = []
        transcripts: dict[str, Transcript] = {}
        calls: dict[str, list[ToolCall]] = {}
        for row in c.execute(lines):
            events.append(trusted_row(RunEvent, row._mapping))
        if not events:
            return {}, [], {}, {}
        # Put in order here, not by PostgreSQL: a bitmap scan of the index gives them
        # unordered, and the sort was a third of the read's cost.
        events.sort(key=attrgetter("run_id", "seq"))
        agents: set[str] = set()
        for run_id, digest, agent in c.execute(
            core_select(runs.c.id, logs_t.c.digest, transcripts_t.c.run_id)
            .select_from(
                runs.outerjoin(logs_t, logs_t.c.run_id == runs.c.id).outerjoin(
                    transcripts_t,
                    (transcripts_t.c.run_id == runs.c.id) & transcripts_t.c.archived.is_(False),
                )
            )
            .where(runs.c.id.in_(sorted({e.run_id for e in events})))
        ):
            chosen[run_id] = digest
            if agent is not None:
                agents.add(run_id)
        if agents:
            calls_t = ToolCall.__table__  # type: ignore[attr-defined]
            agent_ids = sorted(agents)
            for row in c.execute(
                core_select(transcripts_t).where(transcripts_t.c.run_id.in_(agent_ids))
            ):
                transcripts[row.run_id] = trusted_row(Transcript, row._mapping)
            for row in c.execute(
                core_select(calls_t)
                .where(calls_t.c.run_id.in_(agent_ids))
                .order_by(calls_t.c.run_id, calls_t.c.seq)
            ):
                calls.setdefault(row.run_id, []).append(trusted_row(ToolCall, row._mapping))
    return chosen, events, transcripts, calls


class _Moved(Exception):
    """Some runs' lines left run_events since they were read (another node moved them): the
    transaction is rolled back and done again without them."""

    def __init__(self, runs: set[str]) -> None:
        self.runs = runs


def _record_archives(ctx: Context, moves: list[LogMove]) -> int:
    """One transaction: each run's lines read leave run_events as its blob is recorded, and an
    agent run's transcript text and tool calls with them. A run whose lines another node moved
    meanwhile is left out; lines that came after the read stay in run_events, for the next
    pass to merge into a new blob."""
    while moves:
        try:
            _record_archives_once(ctx, moves)
            return len(moves)
        except _Moved as moved:
            moves = [m for m in moves if m.archive.run_id not in moved.runs]
    return 0


def _record_archives_once(ctx: Context, moves: list[LogMove]) -> None:
    ids = sorted(m.archive.run_id for m in moves)
    with session_scope(ctx.engine, write=True) as s:
        postgres = on_postgres(s)
        # The lines read leave run_events: those up to the last seq read (an appender gives
        # a run's seqs under its lock, in commit order, so that is every line read and only
        # those). All must still be there, or another node moved them first.
        lines_read = delete(RunEvent).where(
            or_(
                *(
                    (col(RunEvent.run_id) == m.archive.run_id) & (col(RunEvent.seq) <= m.read[1])
                    for m in moves
                )
            )
        )
        if postgres:
            # First (a one-time filter, before any row is read), the lock every appender of
            # a run's lines takes (services/runs/logs.py), in a fixed order: two nodes moving
            # logs never wait on each other in a circle.
            lines_read = lines_read.where(
                text(
                    "(SELECT count(pg_advisory_xact_lock(hashtext(r))) "
                    "FROM unnest(CAST(:ids AS text[])) AS r) >= 0"
                ).bindparams(ids=ids)
            )
        deleted: Counter[str] = Counter()
        if postgres:
            # A count per run back, not a row per line.
            gone = lines_read.returning(col(RunEvent.run_id)).cte("gone")
            for run_id, count in s.execute(
                core_select(gone.c.run_id, func.count()).group_by(gone.c.run_id)
            ):
                deleted[run_id] = count
        else:
            gone_rows = s.execute(lines_read.returning(col(RunEvent.run_id))).all()
            deleted.update(run_id for (run_id,) in gone_rows)
        moved = {m.archive.run_id for m in moves if deleted[m.archive.run_id] != m.read[0]}
        if moved:
            raise _Moved(moved)
        record_moves(s, moves)


def record_moves(
    s: Writer,
    moves: Sequence[LogMove],
    *,
    extra: Sequence[Any] = (),
    returning: Sequence[Any] = (),
    blobs: Sequence[StagedBlob] = (),
) -> Any:
    """In the transaction that takes the moved lines out of run_events: the blobs' rows, the
    run_logs rows, the agent runs' transcripts emptied and tool calls deleted, and the
    replaced blobs deleted if nothing else names them. On PostgreSQL one statement, with the
    `extra` CTEs and `returning` its result's columns; its result is returned (None on
    SQLite, which takes neither). `blobs`: more rows of objects already in the bucket (a
    run end's artifacts), recorded with the logs' (on PostgreSQL in the same statement,
    where their own INSERT cost a round trip each)."""
    postgres = on_postgres(s)
    logs = [
        {
            "run_id": m.archive.run_id,
            "digest": m.archive.digest,
            "lines": m.archive.lines,
            "last_seq": m.archive.last_seq,
            "created_at": utcnow(),
        }
        for m in moves
    ]
    agents = [(m.transcript, m.call_ids) for m in moves if m.transcript is not None]
    result = None
    if postgres:
        statement = _recorded_in_one(moves, logs, agents, extra=extra, blobs=blobs)
        result = s.execute(statement.returning(*returning) if returning else statement)
    else:
        for blob in [*(m.blob for m in moves), *blobs]:
            insert_blob(s, blob)
        s.execute(_upsert_log(postgres), logs)
        if agents:
            agent_runs.record_archived(cast(Session, s), agents)
    replaced = [m.earlier for m in moves if m.earlier is not None]
    if replaced:
        # Merged: their earlier logs were read, so none of them is held back any more.
        merged = sorted(m.archive.run_id for m in moves if m.earlier is not None)
        s.execute(delete(HeldBack).where(col(HeldBack.run_id).in_(merged)))
        cast(Session, s).flush()
        delete_unreferenced_blobs(cast(Session, s), replaced)
    return result


def _recorded_in_one(
    moves: Sequence[LogMove],
    logs: list[dict[str, Any]],
    agents: list[tuple[Transcript, list[str]]],
    *,
    extra: Sequence[Any] = (),
    blobs: Sequence[StagedBlob] = (),
) -> Any:
    """On PostgreSQL, what _record_archives_once writes once the lines are gone, as one
    statement (one round trip): the blobs' rows, the run_logs rows, and the agent runs'
    transcripts emptied and tool calls deleted (agent.record_archived's two statements)."""
    from sqlalchemy.dialects.postgresql import insert

    now = utcnow()
    staged = {b.digest: b for b in [*blobs, *(m.blob for m in moves)]}
    rows = insert(Blob.__table__).values(  # type: ignore[attr-defined]
        [
            {
                "digest": b.digest,
                "size": b.size,
                "data": b.data,
                "created_at": now,
                "location": b.location,
                "sha256": b.sha256,
            }
            for b in staged.values()
        ]
    )
    ctes = [rows.on_conflict_do_nothing(index_elements=["digest"]).cte("new_blobs")]
    if agents:
        ctes.extend(agent_runs.record_archived_ctes(agents))
    return _upsert_log(True).values(logs).add_cte(*ctes, *extra)


@lru_cache(maxsize=2)
def _upsert_log(postgres: bool) -> Any:
    """INSERT a run_logs row, or replace the run's earlier one (a merged log)."""
    table = RunLog.__table__  # type: ignore[attr-defined]
    if postgres:
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    stmt = insert(table)
    return stmt.on_conflict_do_update(
        index_elements=["run_id"],
        set_={
            "digest": stmt.excluded.digest,
            "lines": stmt.excluded.lines,
            "last_seq": stmt.excluded.last_seq,
            "created_at": stmt.excluded.created_at,
        },
    )


@dataclass
class PendingReport:
    uploaded: int = 0
    deleted: int = 0


def drain_pending(ctx: Context, *, limit: int = PENDING_BATCH) -> PendingReport:
    """Do up to `limit` of the object store's pending uploads and deletes, oldest first.
    Stops at the first the store refuses (counted in `attempts`, kept for the next pass)."""
    report = PendingReport()
    with session_scope(ctx.engine) as s:
        pending = list(
            s.exec(select(PendingBlob).order_by(col(PendingBlob.created_at)).limit(limit)).all()
        )
    for item in pending:
        try:
            if item.action == UPLOAD:
                report.uploaded += _upload_pending(ctx, item.digest)
            elif item.action == DELETE:
                report.deleted += _delete_pending(ctx, item.digest)
        except BlobStoreUnavailable:
            _count_attempt(ctx, item.digest)
            raise
        except BlobUnreadable as exc:
            # Its bytes are damaged where they are: it stays pending (and listed by `floom
            # blobs check`) without holding up the others.
            log.error("pending %s of blob %s: %s", item.action, item.digest, exc.message)
            _count_attempt(ctx, item.digest)
    return report


def _count_attempt(ctx: Context, digest: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.execute(
            update(PendingBlob)
            .where(col(PendingBlob.digest) == digest)
            .values(attempts=PendingBlob.attempts + 1)
        )


def _upload_pending(ctx: Context, digest: str) -> int:
    store = new_blob_store(ctx.settings, ctx.engine)
    if store.inline:
        # Back to the database: the bytes are where new blobs go.
        _forget_pending(ctx, digest)
        return 0
    return _move_blob(ctx, digest, to=store, source=DATABASE)


def _delete_pending(ctx: Context, digest: str) -> int:
    with session_scope(ctx.engine) as s:
        row = s.exec(select(Blob.location).where(Blob.digest == digest)).first()
    if row is not None:
        # Stored again since: its object is needed (or, held in the database while new blobs
        # go to the bucket, it is an upload now).
        if row == DATABASE and not new_blob_store(ctx.settings, ctx.engine).inline:
            with session_scope(ctx.engine, write=True) as s:
                s.execute(
                    update(PendingBlob)
                    .where(col(PendingBlob.digest) == digest)
                    .values(action=UPLOAD, attempts=0)
                )
            return 0
        _forget_pending(ctx, digest)
        return 0
    store_at("s3", ctx.settings, ctx.engine).delete([digest])
    _forget_pending(ctx, digest)
    return 1


def _forget_pending(ctx: Context, digest: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.execute(delete(PendingBlob).where(col(PendingBlob.digest) == digest))


def _move_blob(ctx: Context, digest: str, *, to: BlobStore, source: str) -> int:
    """Move one blob's bytes from the store at `source` to `to`, checked on both sides;
    returns 1 when it moved, 0 when it was moved or deleted meanwhile."""
    with session_scope(ctx.engine) as s:
        row = s.exec(
            select(Blob.size, Blob.sha256).where(Blob.digest == digest, Blob.location == source)
        ).first()
    if row is None:
        _forget_pending(ctx, digest)
        return 0
    size, sha = row
    what = f"blob {digest}"
    held = store_at(source, ctx.settings, ctx.engine)
    try:
        data = held.get(digest, sha256=sha, what=what, size=size)
    except BlobUnreadable:
        # Moved meanwhile (another `floom blobs migrate`, a pending upload done): its bytes
        # left `source` with the row, which no longer names it. Else they are damaged there.
        if not _still_at(ctx, digest, source):
            return 0
        raise
    if sha is None:  # a blob stored before floom kept checksums gets one now
        sha = vouched_sha256(
            data,
            digest=digest,
            max_bytes=ctx.settings.max_bundle_bytes,
            what=what,
            where=held.describe(digest),
        )
    to.put(digest, data, sha256=sha)
    if not to.inline:
        held = to.exists(digest)  # type: ignore[attr-defined]
        if held != len(data):
            raise BlobUnreadable(
                f"{what}: {to.describe(digest)} holds {held} bytes after the upload, not "
                f"{len(data)}; the blob stays where it was",
                hint="check the object store's health, then run the migration again",
            )
    with session_scope(ctx.engine, write=True) as s:
        s.execute(
            update(Blob)
            .where(col(Blob.digest) == digest, col(Blob.location) == source)
            .values(location=to.name, data=data if to.inline else b"", sha256=sha, size=size)
        )
        s.execute(delete(PendingBlob).where(col(PendingBlob.digest) == digest))
    if source != DATABASE:
        try:
            store_at(source, ctx.settings, ctx.engine).delete([digest])
        except BlobStoreUnavailable:
            log.warning("blob %s moved to the database; its object stays in the bucket", digest)
    return 1


def _users(ctx: Context, digest: str, *, most: int = 5) -> str:
    """What refers to a blob, in words: versions, runs' artifacts and logs (a few of each)."""
    with session_scope(ctx.engine) as s:
        versions = s.exec(
            select(Version.id, Version.worker_name).where(Version.digest == digest).limit(most)
        ).all()
        artifacts = s.exec(
            select(Artifact.run_id, Artifact.name).where(Artifact.digest == digest).limit(most)
        ).all()
        logs = s.exec(select(RunLog.run_id).where(RunLog.digest == digest).limit(most)).all()
    found = [f"version {v} of worker {w}" for v, w in versions]
    found += [f"artifact {shown(name)} of run {run}" for run, name in artifacts]
    found += [f"the log of run {run}" for run in logs]
    return ", ".join(found) or "no version, artifact or run log (an agent's workspace?)"


def _still_at(ctx: Context, digest: str, location: str) -> bool:
    with session_scope(ctx.engine) as s:
        return (
            s.exec(
                select(Blob.digest).where(Blob.digest == digest, Blob.location == location)
            ).first()
            is not None
        )


@dataclass
class BlobProblem:
    digest: str
    location: str
    problem: str


@dataclass
class BlobMigration:
    """What `floom blobs migrate` did."""

    to: str
    moved: int = 0
    already: int = 0
    logs_archived: int = 0
    bytes_moved: int = 0
    warnings: list[str] = field(default_factory=list)
    # Blobs left where they were: missing or damaged there (or not held whole by `to`).
    skipped: list[BlobProblem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrate_blobs(ctx: Context, *, to: str, progress: Progress | None = None) -> BlobMigration:
    """Move every blob into the store `to` ("s3" or "database"), one blob per transaction,
    each read back checked against its sha256 and, in a bucket, its size checked after the
    upload. Resumable and idempotent: a blob moved already is passed over, so a run that
    stopped half way is finished by running it again. Moving to the bucket also moves the
    logs of ended runs out of run_events."""
    if to not in ("s3", DATABASE):
        raise InvalidRequest(f"unknown blob store {to!r}", hint="the stores are s3 and database")
    target = store_at(to, ctx.settings, ctx.engine)
    result = BlobMigration(to=to)
    if ctx.settings.blob_store != to:
        result.warnings.append(
            f"FLOOM_BLOB_STORE is {ctx.settings.blob_store}: new blobs still go there; set "
            f"FLOOM_BLOB_STORE={to} on every node"
        )
    with session_scope(ctx.engine) as s:
        result.already = int(
            s.exec(select(func.count()).select_from(Blob).where(Blob.location == to)).one()
        )
    after = ""
    while True:
        with session_scope(ctx.engine) as s:
            chunk = list(
                s.exec(
                    select(Blob.digest, Blob.location, Blob.size)
                    .where(col(Blob.digest) > after, col(Blob.location) != to)
                    .order_by(col(Blob.digest))
                    .limit(WALK_CHUNK)
                ).all()
            )
        if not chunk:
            break
        after = chunk[-1][0]
        for digest, location, size in chunk:
            try:
                moved = _move_blob(ctx, digest, to=target, source=location)
            except BlobUnreadable as exc:
                # One damaged blob does not hold up the others: it stays where it is,
                # named at the end with what refers to it.
                problem = f"{exc.message} (used by {_users(ctx, digest)})"
                result.skipped.append(BlobProblem(digest, location, problem))
                continue
            result.moved += moved
            result.bytes_moved += size if moved else 0
        if progress:
            progress(f"{result.moved} blob(s) moved ({result.bytes_moved} bytes)")
    if not target.inline:
        passed_over: dict[str, BlobProblem] = {}
        result.logs_archived = archive_all_logs(
            ctx, store=target, passed_over=passed_over, progress=progress
        )
        result.skipped += passed_over.values()
    return result


def check_blobs(ctx: Context, *, progress: Progress | None = None) -> tuple[int, list[BlobProblem]]:
    """Read every blob back and check it against its sha256: (blobs checked, problems)."""
    checked, problems = 0, list[BlobProblem]()
    after = ""
    while True:
        with session_scope(ctx.engine) as s:
            chunk = list(
                s.exec(
                    select(Blob.digest, Blob.location)
                    .where(col(Blob.digest) > after)
                    .order_by(col(Blob.digest))
                    .limit(WALK_CHUNK)
                ).all()
            )
        if not chunk:
            return checked, problems
        after = chunk[-1][0]
        for digest, location in chunk:
            try:
                read_blob(ctx.settings, ctx.engine, digest, what=f"blob {digest}")
            except (BlobUnreadable, BlobStoreUnavailable) as exc:
                problems.append(BlobProblem(digest, location, exc.message))
            checked += 1
        if progress:
            progress(f"{checked} blob(s) checked, {len(problems)} problem(s)")


def object_store_problem(ctx: Context) -> str | None:
    """Why blobs meant for the object store wait in the database, if some do: for metrics and
    `floom doctor` (None when nothing waits)."""
    with session_scope(ctx.engine) as s:
        waiting = int(s.exec(select(func.count()).select_from(PendingBlob)).one())
    return f"{waiting} blob(s) wait for the object store" if waiting else None


# -- objects no row refers to -----------------------------------------------------------------

# What the sweep writes in the blobs row it holds, uncommitted, while it deletes an object.
SWEEPING = "sweeping"
# Objects looked up in the database, then deleted, per transaction by the sweep.
SWEEP_BATCH = 200


def sweep_objects(ctx: Context, *, older_than: datetime) -> int:
    """Delete from the bucket (FLOOM_S3_BUCKET under FLOOM_S3_PREFIX) the objects written
    before `older_than` that no blobs row names: uploaded for an end that was never recorded
    (the node stopped, the database failed before the commit), or left by a move whose
    delete failed. Returns how many went; 0 without a bucket. Raises BlobStoreUnavailable
    while the bucket is away (nothing is deleted that was not checked).

    The race with a writer (every writer puts its object, then commits the row naming it):
    an object put since the listing is either new (not listed) or written again since
    `older_than` (its date read again below, so it stays). In one write transaction per
    batch, each candidate's digest is first inserted into the blobs table as a row of this
    sweep's own (never committed): a digest a committed row names conflicts and is kept,
    and one that a writer's transaction is inserting makes this INSERT wait for it to end
    (PostgreSQL's unique index; SQLite's write lock), so a writer that commits a row
    meanwhile keeps its object. While those rows are held, a writer's INSERT of the same
    digest waits in turn, until the objects are deleted and the rows given up."""
    if not ctx.settings.s3_bucket:
        return 0
    store = store_at("s3", ctx.settings, ctx.engine)
    assert isinstance(store, S3BlobStore)
    old = [digest for digest, written in store.listing() if written < older_than]
    deleted = 0
    for i in range(0, len(old), SWEEP_BATCH):
        deleted += _sweep_batch(ctx, store, old[i : i + SWEEP_BATCH], older_than=older_than)
    return deleted


def _sweep_batch(
    ctx: Context, store: S3BlobStore, digests: list[str], *, older_than: datetime
) -> int:
    blobs = Blob.__table__  # type: ignore[attr-defined]
    now = utcnow()
    with write_connection(ctx.engine) as c:
        if on_postgres(c):
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        held = [
            digest
            for (digest,) in c.execute(
                insert(blobs)
                .values(
                    [
                        {
                            "digest": d,
                            "size": 0,
                            "data": b"",
                            "created_at": now,
                            "location": SWEEPING,
                            "sha256": None,
                        }
                        for d in digests
                    ]
                )
                .on_conflict_do_nothing(index_elements=["digest"])
                .returning(blobs.c.digest)
            )
        ]
        # Written again since it was listed (a writer storing the same bytes): kept.
        gone = [d for d in held if (at := store.written_at(d)) is not None and at < older_than]
        if gone:
            store.delete(gone)
            log.info("deleted %d object(s) no blob row names from the bucket", len(gone))
        if held:
            c.execute(delete(blobs).where(blobs.c.digest.in_(held), blobs.c.location == SWEEPING))
    return len(gone)
