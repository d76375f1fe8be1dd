"""A run's ordered events: log lines from its process and floom's own notices."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, text
from sqlmodel import Session, col, select

from floom.store.db import session_scope
from floom.store.models import RunEvent, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

STREAMS = ("stdout", "stderr", "system")


def append_events(
    s: Session,
    *,
    run_id: str,
    attempt: int,
    lines: Sequence[tuple[str, str, datetime | None]],
    first: bool = False,
) -> int:
    """Append (stream, line, ts) rows after the run's last seq; returns the last seq written.
    `first`: the run was inserted in this very transaction, so it has no events yet and no
    other writer can see it (no read of the last seq, no lock).

    Callers hold a write session, which makes the read of the last seq and the inserts one
    atomic step: SQLite's write lock does it there; on PostgreSQL a per-run advisory lock
    does, since an executor's log flusher and a state change (a pause, a decision) may append
    at the same moment. (Not the run's row lock: heartbeats skip locked runs as lost.)
    """
    seq = 0
    if not first:
        lock_events(s, run_id=run_id)
        last = s.exec(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run_id)).one()
        seq = int(last or 0)
    for stream, line, ts in lines:
        seq += 1
        s.add(
            RunEvent(
                run_id=run_id, seq=seq, attempt=attempt, ts=ts or utcnow(), stream=stream, line=line
            )
        )
    return seq


def lock_events(s: Session, *, run_id: str) -> None:
    """Take the run's event lock for this transaction (PostgreSQL; SQLite's write lock already
    serialises writers). Writers that also lock the run's row take this lock first."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(hashtext(:run_id))"), {"run_id": run_id})


def system_event(
    s: Session, *, run_id: str, attempt: int, message: str, first: bool = False
) -> None:
    append_events(s, run_id=run_id, attempt=attempt, lines=[("system", message, None)], first=first)


def list_events(ctx: Context, *, run_id: str, after: int = 0, limit: int = 1000) -> list[RunEvent]:
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(RunEvent)
                .where(RunEvent.run_id == run_id, RunEvent.seq > after)
                .order_by(col(RunEvent.seq))
                .limit(limit)
            ).all()
        )


def tail_events(ctx: Context, *, run_id: str, count: int) -> list[RunEvent]:
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(RunEvent)
            .where(RunEvent.run_id == run_id)
            .order_by(col(RunEvent.seq).desc())
            .limit(count)
        ).all()
    return list(reversed(rows))


def event_to_dict(e: RunEvent) -> dict[str, Any]:
    return {"seq": e.seq, "ts": e.ts, "stream": e.stream, "line": e.line, "attempt": e.attempt}
