"""A run's ordered events: log lines from its process and floom's own notices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, insert, text
from sqlalchemy import select as core_select
from sqlmodel import col, select

from floom.services.access.principal import Principal
from floom.store.blobs.logs import cached_log, decode_log
from floom.store.blobs.rows import read_blob
from floom.store.blobs.tables import RunLog
from floom.store.db import Writer, on_postgres, session_scope
from floom.store.models import RunEvent, utcnow
from floom.store.statements import hot

if TYPE_CHECKING:
    from floom.services.context import Context

STREAMS = ("stdout", "stderr", "system")
# A seq is a 32-bit integer in the store: a caller's `after` past it asks for nothing more.
MAX_SEQ = 2**31 - 1


def append_events(
    s: Writer,
    *,
    run_id: str,
    attempt: int,
    lines: Sequence[tuple[str, str, datetime | None]],
    first: bool = False,
    locked: bool = False,
) -> None:
    """Append (stream, line, ts) rows after the run's last seq, in order.
    `first`: the run was inserted in this very transaction, so it has no events yet and no
    other writer can see it (seqs from 1, no lock). `locked`: the transaction has taken the
    run's event lock already (lock_events), which spares PostgreSQL a second round trip.

    Callers hold a write session, which makes each row's read of the last seq and its insert
    one atomic step: SQLite's write lock does it there; on PostgreSQL a per-run advisory lock
    does, since an executor's log flusher and a state change (a pause, a decision) may append
    at the same moment. (Not the run's row lock: heartbeats skip locked runs as lost.)
    """
    if not lines:
        return
    now = utcnow()
    rows = [
        {
            "run_id": run_id,
            "attempt": attempt,
            "ts": ts or now,
            "stream": stream,
            "line": line,
        }
        for stream, line, ts in lines
    ]
    if first:
        for seq, row in enumerate(rows, 1):
            row["seq"] = seq
        EVENTS_INSERT.rows(s, rows)
        return
    if not locked:
        lock_events(s, run_id=run_id)
    if on_postgres(s):
        # One statement for all the rows, which reads the run's last seq once: a lookup per
        # row cost PostgreSQL a scan each wherever its cached plan for a table that looked
        # empty was one (object storage empties run_events as logs move).
        EVENTS_INSERT_PG.rows(
            s,
            {
                "run_id": run_id,
                "attempts": [r["attempt"] for r in rows],
                "ts": [r["ts"] for r in rows],
                "streams": [r["stream"] for r in rows],
                "lines": [r["line"] for r in rows],
            },
        )
        return
    # One statement per row that reads the last seq itself; run as one executemany.
    EVENTS_INSERT_NEXT.rows(s, rows)


_PG_INSERT_BATCH = text(
    "INSERT INTO run_events (run_id, attempt, ts, stream, line, seq) "
    "SELECT :run_id, v.attempt, v.ts, v.stream, v.line, b.base + v.ord "
    "FROM unnest(CAST(:attempts AS integer[]), CAST(:ts AS timestamptz[]), "
    "CAST(:streams AS varchar[]), CAST(:lines AS text[])) "
    "WITH ORDINALITY AS v(attempt, ts, stream, line, ord) "
    "CROSS JOIN (SELECT coalesce(max(e.seq), "
    "(SELECT l.last_seq FROM run_logs l WHERE l.run_id = :run_id), 0) AS base "
    "FROM run_events e WHERE e.run_id = :run_id) AS b"
)


@dataclass(frozen=True)
class _EventStatements:
    insert: Any
    insert_next: Any  # each row's seq is the run's last seq + 1, read by the insert itself


@lru_cache(maxsize=1)
def _event_statements() -> _EventStatements:
    """Built once (building a statement costs more than running it); Core inserts, since the
    rows are never read back."""
    events = RunEvent.__table__  # type: ignore[attr-defined]
    archived = RunLog.__table__  # type: ignore[attr-defined]
    names = ("run_id", "attempt", "ts", "stream", "line")
    # A line after the run's log moved into a blob (a cancelled attempt's last words)
    # follows the blob's last seq: asked only when the table holds none of the run's lines.
    archived_last = (
        core_select(archived.c.last_seq)
        .where(archived.c.run_id == bindparam("run_id"))
        .scalar_subquery()
    )
    last = (
        core_select(func.coalesce(func.max(events.c.seq), archived_last, 0) + 1)
        .where(events.c.run_id == bindparam("run_id"))
        .scalar_subquery()
    )
    fill = core_select(*(bindparam(n, type_=events.c[n].type) for n in names), last)
    return _EventStatements(
        insert=insert(events),
        insert_next=insert(events).from_select([*names, "seq"], fill),
    )


EVENTS_INSERT = hot.Statement(
    "events.insert",
    lambda: _event_statements().insert,
    keys=("run_id", "attempt", "ts", "stream", "line", "seq"),
)
EVENTS_INSERT_NEXT = hot.Statement("events.insert_next", lambda: _event_statements().insert_next)
EVENTS_INSERT_PG = hot.Statement("events.insert_pg", lambda: _PG_INSERT_BATCH)
EVENTS_LOCK = hot.Statement(
    "events.lock", lambda: text("SELECT pg_advisory_xact_lock(hashtext(:run_id))")
)


def lock_events(s: Writer, *, run_id: str) -> None:
    """Take the run's event lock for this transaction (PostgreSQL; SQLite's write lock already
    serialises writers). Writers that also lock the run's row take this lock first."""
    if on_postgres(s):
        EVENTS_LOCK.rows(s, {"run_id": run_id})


def system_event(
    s: Writer, *, run_id: str, attempt: int, message: str, first: bool = False
) -> None:
    append_events(s, run_id=run_id, attempt=attempt, lines=[("system", message, None)], first=first)


def list_events(
    ctx: Context, *, run_id: str, after: int = 0, limit: int = 1000, caller: Principal
) -> list[RunEvent]:
    """A run's log events with a seq above `after`, oldest first. Needs the read scope.

    An ended run's log may have moved into one blob (services/ops/objects.py), which is read
    when the table's lines do not start right after `after`. The move deletes the run's rows
    in the transaction that records the blob, so the two never hold the same line."""
    caller.require("read")
    # Whatever number a caller gives (a query, a Last-Event-ID): one the store can compare.
    after = min(max(after, 0), MAX_SEQ)
    with session_scope(ctx.engine) as s:
        rows = list(
            s.exec(
                select(RunEvent)
                .where(RunEvent.run_id == run_id, RunEvent.seq > after)
                .order_by(col(RunEvent.seq))
                .limit(limit)
            ).all()
        )
        archived = None if rows and rows[0].seq == after + 1 else s.get(RunLog, run_id)
    if archived is None or archived.last_seq <= after:
        return rows
    events = [e for e in _archived_events(ctx, archived) if e.seq > after]
    return (events + rows)[:limit]


def tail_events(ctx: Context, *, run_id: str, count: int, caller: Principal) -> list[RunEvent]:
    """A run's last `count` log events, oldest first. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        rows = list(
            reversed(
                s.exec(
                    select(RunEvent)
                    .where(RunEvent.run_id == run_id)
                    .order_by(col(RunEvent.seq).desc())
                    .limit(count)
                ).all()
            )
        )
        archived = s.get(RunLog, run_id) if len(rows) < count else None
    if archived is None:
        return rows
    wanted = count - len(rows)
    return _archived_events(ctx, archived)[-wanted:] + rows


def _archived_events(ctx: Context, archived: RunLog) -> list[RunEvent]:
    cached = cached_log(archived.digest)
    if cached is not None:
        return cached
    data = read_blob(
        ctx.settings, ctx.engine, archived.digest, what=f"the log of run {archived.run_id}"
    )
    return decode_log(archived.run_id, archived.digest, data)
