"""The alert watch's pace on a node (floom/services/alerts/watch.py, Pace): an idle pass is
one statement (the probe), and nothing comes later than a pass every FLOOM_ALERT_POLL_SECONDS
found it before: each alert that comes due with time is recorded at the first pass at or
after its time, also when a change (a new approval, schedule or node) brings its deadline
nearer than the one the watch computed, and a run's failure at the next pass. Both stores.

The passes are driven with the times they see (5 s apart, as FLOOM_ALERT_POLL_SECONDS has
it), as the node's loop would make them; the loop itself: test_alert_loop_pace.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlmodel import col, select

from floom.services.alerts import watch
from floom.services.context import Context
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.store.models import AlertEvent, Run, Worker, new_id, utcnow
from floom.store.nodes import Node
from floom.store.triggers import Trigger
from floom.triggers.spec import ScheduleSpec, spec_to_config, trigger_key
from floom.vocabulary import ApprovalKind, ApprovalStatus, RunStatus, TriggerKind
from tests.support.harness import fast_settings

WAIT = 30.0  # FLOOM_ALERT_APPROVAL_WAIT_SECONDS
GRACE = 20.0  # FLOOM_ALERT_SCHEDULE_GRACE_SECONDS
STUCK = 40.0  # FLOOM_ALERT_SCHEDULE_STUCK_SECONDS
POLL = timedelta(seconds=5)


@pytest.fixture
def paced(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(
        fast_settings(
            tmp_path / "data",
            database_url,
            lease_seconds=60.0,
            alert_approval_wait_seconds=WAIT,
            alert_schedule_grace_seconds=GRACE,
            alert_schedule_stuck_seconds=STUCK,
        )
    )
    yield context
    context.engine.dispose()


class Passes:
    """A node's passes, one every POLL from `start`: each pass's statements and the kinds of
    the events recorded so far, with the first pass each was seen at."""

    def __init__(self, ctx: Context, start: datetime) -> None:
        self.ctx, self.now, self.pace = ctx, start, watch.Pace()
        self.sent: list[str] = []
        self.first_seen: dict[str, datetime] = {}
        event.listen(ctx.engine, "before_cursor_execute", self._note)

    def _note(self, conn: object, cursor: object, statement: str, *args: object) -> None:
        # (SQLite's BEGIN is the driver's own, sent before a transaction's first statement.)
        if not statement.startswith("BEGIN"):
            self.sent.append(statement)

    def one(self) -> int:
        """One pass at the next time; how many statements it sent."""
        self.now += POLL
        before = len(self.sent)
        watch.watch(self.ctx, now=self.now, pace=self.pace)
        sent = len(self.sent) - before
        with session_scope(self.ctx.engine) as s:
            rows = s.exec(select(AlertEvent.key, AlertEvent.kind)).all()
        del self.sent[before + sent :]  # not the pass's: this reading
        for key, kind in rows:
            self.first_seen.setdefault(f"{kind} {key}", self.now)
        return sent

    def until(self, at: datetime) -> list[int]:
        """Passes up to `at` (included); the statements of each."""
        counts = []
        while self.now + POLL <= at:
            counts.append(self.one())
        return counts

    def seen(self, what: Callable[[str], bool]) -> list[datetime]:
        return [at for name, at in self.first_seen.items() if what(name)]

    def close(self) -> None:
        event.remove(self.ctx.engine, "before_cursor_execute", self._note)


def _start(ctx: Context) -> Passes:
    # On a minute, so a once-a-minute schedule's ticks fall at known offsets; a little in
    # the past, as the probe's ids come from the clock.
    start = utcnow().replace(second=0, microsecond=0) - timedelta(minutes=1)
    passes = Passes(ctx, start)
    passes.one()  # the first pass reads everything
    return passes


def _first_pass_at_or_after(start: datetime, at: datetime) -> datetime:
    steps = -(-(at - start) // POLL)  # ceiling
    return start + steps * POLL


def _naming(part: str) -> Callable[[str], bool]:
    return lambda name: part in name


def _add(ctx: Context, *rows: object) -> None:
    with session_scope(ctx.engine, write=True) as s:
        for row in rows:
            s.add(row)


def test_an_idle_pass_is_one_statement_and_a_failure_is_seen_at_the_next_pass(
    paced: Context,
) -> None:
    passes = _start(paced)
    _add(
        paced,
        Node(
            id="n1",
            roles="api",
            version="t",
            lease_seconds=3600,
            started_at=passes.now,
            heartbeat_at=passes.now,
        ),
    )
    passes.one()  # a node started: a change, and a whole pass
    idle = passes.until(passes.now + 12 * POLL)
    assert idle == [1] * 12  # the probe, and nothing else

    ended = passes.now + timedelta(seconds=2)
    _add(
        paced,
        Run(
            id=new_id("run"),
            worker_name="w",
            version_id="v",
            status=RunStatus.FAILED,
            finished_at=ended,
        ),
    )
    assert passes.one() > 1
    assert passes.seen(lambda name: name.startswith("run.failed")) == [passes.now]
    assert passes.until(passes.now + 3 * POLL) == [1] * 3
    passes.close()


def test_an_approval_waiting_alerts_at_its_wait_also_one_asked_after_a_later_one(
    paced: Context,
) -> None:
    passes = _start(paced)
    t0 = passes.now
    first = Approval(
        id=new_id("apr"), run_id="r1", worker_name="w", kind=ApprovalKind.TOOL_CALL, created_at=t0
    )
    _add(paced, first)
    passes.until(t0 + 2 * POLL)
    # Asked earlier than the pending one (its row committed late): its deadline is nearer
    # than the one the watch computed from the first.
    second = Approval(
        id=new_id("apr"),
        run_id="r2",
        worker_name="w",
        kind=ApprovalKind.TOOL_CALL,
        created_at=t0 - timedelta(seconds=7),
    )
    _add(paced, second)
    passes.until(t0 + 3 * POLL)
    # Named ten minutes before its row was written (an agent names its approval, saves its
    # workspace, then writes the row): its id is older than the probe's anchor.
    named = utcnow() - timedelta(minutes=10)
    third = Approval(
        id=f"apr_{int(named.timestamp() * 1_000_000):014x}00000000",
        run_id="r3",
        worker_name="w",
        kind=ApprovalKind.TOOL_CALL,
        created_at=t0 - timedelta(seconds=12),
    )
    _add(paced, third)
    counts = passes.until(t0 + timedelta(seconds=WAIT) + 3 * POLL)

    for approval in (first, second, third):
        due = approval.created_at + timedelta(seconds=WAIT)
        assert passes.seen(_naming(approval.id)) == [_first_pass_at_or_after(t0, due)]
    # Between the change and the deadlines, passes skipped the approvals check.
    assert counts.count(1) >= 2
    passes.close()


def test_a_node_started_with_a_shorter_lease_is_lost_on_time(paced: Context) -> None:
    passes = _start(paced)
    t0 = passes.now
    _add(
        paced,
        Node(
            id="long", roles="api", version="t", lease_seconds=600, started_at=t0, heartbeat_at=t0
        ),
    )
    passes.until(t0 + 2 * POLL)
    joined = t0 + timedelta(seconds=11)
    _add(
        paced,
        Node(
            id="short",
            roles="executor",
            version="t",
            lease_seconds=12,
            started_at=joined,
            heartbeat_at=joined,
        ),
    )
    counts = passes.until(joined + timedelta(seconds=12) + 3 * POLL)

    lost = passes.seen(lambda name: name.startswith("node.lost"))
    # Silent past its lease: lost at the first pass after heartbeat + lease.
    assert lost == [_first_pass_at_or_after(t0, joined + timedelta(seconds=12, microseconds=1))]
    assert counts[:2].count(1) >= 1  # before it came due, passes were the probe alone
    passes.close()


def _schedule(ctx: Context, worker: str, cron: str, at: datetime) -> Trigger:
    spec = ScheduleSpec(cron=cron)
    trigger = Trigger(
        id=new_id("trg"),
        worker_name=worker,
        kind=TriggerKind.SCHEDULE,
        key=trigger_key(spec),
        config_json=json.dumps(spec_to_config(spec)),
        last_fire_at=at,
        created_at=at,
        updated_at=at,
    )
    _add(ctx, trigger)
    return trigger


def test_a_schedule_synced_with_a_nearer_tick_is_missed_on_time(paced: Context) -> None:
    passes = _start(paced)
    t0 = passes.now
    tick = t0.replace(second=0) + timedelta(minutes=1)  # the next minute
    _add(paced, Worker(name="w", active_version_id="v"))
    _schedule(paced, "w", "0 0 1 1 *", t0)  # yearly: nothing due for months
    passes.one()
    idle = passes.until(t0 + 3 * POLL)
    assert idle
    assert set(idle) == {1}
    # A schedule synced meanwhile whose first tick is the next minute; no scheduler runs.
    nearer = _schedule(paced, "w", "* * * * *", t0 + timedelta(seconds=16))
    passes.until(tick + timedelta(seconds=GRACE) + 2 * POLL)

    missed = passes.seen(lambda name: name.startswith("schedule.missed") and nearer.id in name)
    assert missed == [_first_pass_at_or_after(t0, tick + timedelta(seconds=GRACE))]
    passes.close()


def _failed(ctx: Context, at: datetime) -> Run:
    run = Run(
        id=new_id("run"), worker_name="w", version_id="v", status=RunStatus.FAILED, finished_at=at
    )
    _add(ctx, run)
    return run


def test_a_failure_after_the_clock_steps_back_is_seen_at_the_next_pass(paced: Context) -> None:
    """The clock steps back ten minutes (a correction of a clock that ran ahead): the probe's
    anchor and the runs cursor, set from the clock as it was, are ahead of every time written
    since. A run that fails then is still seen at the next pass, and so is one after it."""
    passes = _start(paced)
    _failed(paced, passes.now + timedelta(seconds=1))
    passes.one()  # seen; the runs cursor moves to this pass's time
    passes.until(passes.now + 3 * POLL)

    passes.now -= timedelta(minutes=10)  # the clock steps back, and a run fails at once
    early = _failed(paced, passes.now + timedelta(seconds=2))
    passes.one()
    assert passes.seen(_naming(early.id)) == [passes.now]
    passes.until(passes.now + 4 * POLL)
    later = _failed(paced, passes.now + timedelta(seconds=2))
    passes.one()
    assert passes.seen(_naming(later.id)) == [passes.now]
    passes.close()


def test_a_lost_node_forgotten_closes_its_incident_and_idle_passes_are_one_statement_again(
    paced: Context,
) -> None:
    """A lost node that never comes back is forgotten a day later (its row deleted when another
    node starts): its incident closes then, and idle passes stop looking at the nodes."""
    passes = _start(paced)
    t0 = passes.now
    _add(
        paced,
        Node(id="gone", roles="api", version="t", lease_seconds=6, started_at=t0, heartbeat_at=t0),
    )
    passes.until(t0 + 4 * POLL)
    assert passes.seen(lambda name: name.startswith("node.lost")) != []
    with session_scope(paced.engine, write=True) as s:
        row = s.get(Node, "gone")
        assert row is not None
        s.delete(row)  # as nodes.register does a day after its last heartbeat
    passes.until(passes.now + 2 * POLL)
    assert passes.seen(lambda name: name.startswith("recovered") and "node:gone" in name) != []
    assert passes.until(passes.now + 3 * POLL) == [1] * 3
    passes.close()


def test_a_node_lost_and_heard_again_twice_recovers_twice(paced: Context) -> None:
    """A node lost, heard again, lost again (a flaky link) and heard again: its second
    incident closes as its first did."""
    passes = _start(paced)
    t0 = passes.now
    _add(
        paced,
        Node(id="flaky", roles="api", version="t", lease_seconds=6, started_at=t0, heartbeat_at=t0),
    )
    for _ in range(2):
        passes.until(passes.now + 3 * POLL)  # silent past its lease: lost
        with session_scope(paced.engine, write=True) as s:
            row = s.get(Node, "flaky")
            assert row is not None
            row.heartbeat_at = passes.now  # heard again
            s.add(row)
        passes.one()
    with session_scope(paced.engine) as s:
        kinds = s.exec(select(AlertEvent.kind).order_by(col(AlertEvent.id))).all()
    assert kinds == ["node.lost", "recovered", "node.lost", "recovered"]
    passes.close()


def test_a_missed_schedule_removed_closes_its_incident(paced: Context) -> None:
    """A schedule whose tick was missed is then removed (worker.yml redeployed without it):
    its incident closes, as nothing could close it after."""
    passes = _start(paced)
    t0 = passes.now
    _add(paced, Worker(name="w", active_version_id="v"))
    trigger = _schedule(paced, "w", "* * * * *", t0 - timedelta(minutes=3))

    def change(**values: object) -> None:
        with session_scope(paced.engine, write=True) as s:
            row = s.get(Trigger, trigger.id)
            assert row is not None
            for name, value in {**values, "updated_at": passes.now}.items():
                setattr(row, name, value)
            s.add(row)

    change()  # synced now, its last tick three minutes back
    passes.one()
    assert passes.seen(lambda name: name.startswith("schedule.missed")) != []
    change(removed_at=passes.now)
    passes.until(passes.now + 2 * POLL)
    closed = passes.seen(lambda name: name.startswith("recovered") and trigger.id in name)
    assert closed != []
    passes.close()


def test_an_approval_written_late_while_another_is_decided_alerts_at_its_wait(
    paced: Context,
) -> None:
    """Between two passes, one approval is decided and another is written late, its id older
    than the probe's anchor (an agent names its approval before it writes the row): the
    pending count is as it was, and no id is newer than the anchor, yet the late one's wait
    is nearer than the deadline the watch computed from the first."""
    passes = _start(paced)
    t0 = passes.now
    first = Approval(
        id=new_id("apr"), run_id="r1", worker_name="w", kind=ApprovalKind.TOOL_CALL, created_at=t0
    )
    _add(paced, first)
    passes.until(t0 + 2 * POLL)
    named = utcnow() - timedelta(minutes=10)
    late = Approval(
        id=f"apr_{int(named.timestamp() * 1_000_000):014x}00000000",
        run_id="r2",
        worker_name="w",
        kind=ApprovalKind.TOOL_CALL,
        created_at=t0 - timedelta(seconds=10),
    )
    with session_scope(paced.engine, write=True) as s:
        row = s.get(Approval, first.id)
        assert row is not None
        row.status = ApprovalStatus.APPROVED
        row.decided_at = passes.now
        s.add(row)
        s.add(late)
    counts = passes.until(t0 + timedelta(seconds=WAIT) + 2 * POLL)

    due = late.created_at + timedelta(seconds=WAIT)
    assert passes.seen(_naming(late.id)) == [_first_pass_at_or_after(t0, due)]
    assert passes.seen(_naming(first.id)) == []
    assert counts[-2:] == [1, 1]  # idle again: the probe alone
    passes.close()
