"""What an idle node sends the database: the alert watch's pass that reads nothing new writes
nothing (its cursors stay until they are CURSOR_STEP behind), and what ends after such passes
is still seen; a node's heartbeat is one statement. (The dispatcher's idle looks:
test_idle_wakeups.py.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import event
from sqlmodel import select

from floom.services.alerts import watch
from floom.services.context import Context
from floom.services.ops import nodes
from floom.store.db import session_scope
from floom.store.models import AlertCursor, AlertEvent, Run, new_id, utcnow
from floom.store.nodes import Node
from floom.vocabulary import RunStatus


def _sent(ctx: Context, step: Callable[[], object]) -> list[str]:
    """The statements `step` sent, verb first, upper case."""
    sent: list[str] = []

    def note(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(" ".join(statement.split()).upper())

    event.listen(ctx.engine, "before_cursor_execute", note)
    try:
        step()
    finally:
        event.remove(ctx.engine, "before_cursor_execute", note)
    return sent


def _writes(ctx: Context, at: datetime) -> list[str]:
    sent = _sent(ctx, lambda: watch.watch(ctx, now=at))
    return [q for q in sent if q.startswith(("INSERT", "UPDATE", "DELETE"))]


def _cursors(ctx: Context) -> dict[str, object]:
    with session_scope(ctx.engine) as s:
        return {c.name: c.at for c in s.exec(select(AlertCursor)).all()}


def _failed(ctx: Context, at: datetime) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            Run(
                id=new_id("run"),
                worker_name="w",
                version_id="v",
                status=RunStatus.FAILED,
                finished_at=at,
            )
        )


def _failures(ctx: Context) -> int:
    with session_scope(ctx.engine) as s:
        return len([e for e in s.exec(select(AlertEvent)).all() if e.kind == "run.failed"])


def test_an_idle_alert_pass_writes_nothing_and_a_later_failure_is_still_seen(
    ctx: Context,
) -> None:
    t0 = utcnow()
    _failed(ctx, t0 - timedelta(seconds=10))
    # The first pass that reads something makes its cursor.
    assert _writes(ctx, t0)
    assert (_failures(ctx), _cursors(ctx)) == (1, {"runs": t0})

    # Passes every few seconds that read only the margin behind the cursor again (that
    # failure) or nothing at all: no write, the cursor stays.
    for seconds in (5, 10, 30):
        assert _writes(ctx, t0 + timedelta(seconds=seconds)) == []
    assert _cursors(ctx) == {"runs": t0}

    # A run that failed since is read from the cursor that stayed, and moves it.
    _failed(ctx, t0 + timedelta(seconds=35))
    assert _writes(ctx, t0 + timedelta(seconds=40))
    assert (_failures(ctx), _cursors(ctx)) == (2, {"runs": t0 + timedelta(seconds=40)})
    assert _writes(ctx, t0 + timedelta(seconds=45)) == []

    # A cursor CURSOR_STEP behind moves on, though nothing new was read.
    later = t0 + timedelta(seconds=40) + watch.CURSOR_STEP
    _writes(ctx, later)
    assert _cursors(ctx) == {"runs": later}


def test_a_node_s_heartbeat_is_one_statement(ctx: Context) -> None:
    """Every node sends it every FLOOM_HEARTBEAT_SECONDS, idle or not: one UPDATE of its
    row (it read the row first), which still renews it."""
    nodes.register(ctx, slots=2)
    with session_scope(ctx.engine) as s:
        row = s.get(Node, ctx.node_id)
        assert row is not None
        before = row.heartbeat_at

    sent = _sent(ctx, lambda: nodes.heartbeat(ctx, slots_in_use=1, warm=None))

    # (SQLite's write lock is taken by a BEGIN IMMEDIATE of its own.)
    assert [q.split(" ", 1)[0] for q in sent if not q.startswith("BEGIN")] == ["UPDATE"]
    with session_scope(ctx.engine) as s:
        row = s.get(Node, ctx.node_id)
        assert row is not None
        assert (row.slots_in_use, row.stopped_at) == (1, None)
        assert row.heartbeat_at >= before
