"""Background loops with nothing to do sleep until a change concerns them: the scheduler
until a schedule is synced, the handoff loop until a job takes a lease."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event

from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine import dispatch
from floom.engine.executor import Executor
from floom.engine.loops.handoffs import HandoffLoop
from floom.engine.loops.scheduler import Scheduler
from floom.engine.runtime import NodeRuntime, listening
from floom.sandbox.fake import FakeSandbox
from floom.services import wakeups
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.handoffs import flow
from floom.services.handoffs import jobs as handoffs
from floom.services.workers import versions as workers
from floom.store import signals
from floom.store.db import is_postgres, session_scope
from floom.store.models import Run, new_id, utcnow
from floom.vocabulary import RunStatus
from tests.support.harness import make_worker, wait_until
from tests.support.rigs.handoffs import agent, roles

# How long an idle loop is watched for wake-ups it should not make. The loops used to look
# every second (scheduler) and every reap interval (handoffs, 0.3 s in these settings).
QUIET_WINDOW_SECONDS = 1.5


def watch_quietly() -> None:
    """Let time pass in which an idle loop must not look (not a synchronisation)."""
    threading.Event().wait(QUIET_WINDOW_SECONDS)


class CountingScheduler(Scheduler):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.ticks: list[datetime | None] = []

    def tick(self, now: datetime | None = None) -> datetime | None:
        upcoming = super().tick(now)
        self.ticks.append(upcoming)
        return upcoming


@pytest.fixture(autouse=True)
def no_idle_look(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a change may wake an idle loop during these tests.
    monkeypatch.setattr(wakeups, "IDLE_LOOK_SECONDS", 3600.0)


def test_the_scheduler_sleeps_until_a_schedule_is_synced(ctx: Context, tmp_path: Path) -> None:
    scheduler = CountingScheduler(ctx)
    scheduler.start()
    try:
        wait_until(lambda: len(scheduler.ticks) == 1)
        watch_quietly()
        assert scheduler.ticks == [None]
        folder = make_worker(
            tmp_path / "tick",
            'name: tick\ntriggers:\n  - schedule: {cron: "0 0 1 1 *"}\n',
            {"run.py": "print('tick')\n"},
        )
        workers.deploy(
            ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**6).to_archive()
        )
        # Woken by the deploy's commit, it finds the schedule and its next fire time...
        wait_until(lambda: any(upcoming is not None for upcoming in scheduler.ticks))
        # ...and sleeps until then (New Year), not second by second.
        ticks = len(scheduler.ticks)
        watch_quietly()
        assert len(scheduler.ticks) == ticks
    finally:
        scheduler.stop()


def test_the_handoff_loop_sleeps_until_a_job_takes_a_lease(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[bool] = []
    any_lease_held = flow.any_lease_held

    def counted(ctx: Context) -> bool:
        held = any_lease_held(ctx)
        looks.append(held)
        return held

    monkeypatch.setattr(flow, "any_lease_held", counted)
    roles(ctx, "coder")
    lead, coder = agent(ctx, "lead"), agent(ctx, "coder-1", "coder")
    loop = HandoffLoop(ctx, bridge=True)
    loop.start()
    try:
        wait_until(lambda: looks == [False])
        watch_quietly()
        assert looks == [False]
        job = handoffs.create_job(ctx, actor=lead, summary="fix it", role="coder")
        flow.claim(ctx, actor=coder, job_id=job.row.id)
        # Woken by the claim's commit, it watches the lease from now on.
        wait_until(lambda: True in looks)
    finally:
        loop.stop()


def _publish_queued(ctx: Context, **fields: object) -> str:
    """A queued run written as floom's writers write one: with its signal, on commit."""
    with session_scope(ctx.engine, write=True) as s:
        run = Run(id=new_id("run"), worker_name="w", version_id="v", status=RunStatus.QUEUED)
        for name, value in fields.items():
            setattr(run, name, value)
        s.add(run)
        signals.publish(s, signals.RUN_QUEUED)
    return run.id


def _left_queue(ctx: Context, run_id: str) -> bool:
    with session_scope(ctx.engine) as s:
        run = s.get(Run, run_id)
        return run is not None and run.status != RunStatus.QUEUED


def test_an_idle_dispatcher_that_hears_every_signal_does_not_poll_the_queue(
    ctx: Context,
) -> None:
    """With nothing queued, a node whose signal listener is caught up looks at the queue
    when a run is queued (its signal), or when a run held back by a retry's backoff becomes
    runnable (no signal says so), not every poll interval (0.05 s here: 30 reads in the
    window)."""
    if not is_postgres(ctx.engine):
        pytest.skip("signals are PostgreSQL's; a node on SQLite polls (another process may write)")
    runtime = NodeRuntime.of(ctx)
    looks: list[str] = []

    def note(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().startswith("SELECT (SELECT runs.id"):
            looks.append(statement)

    with listening(ctx, runtime):
        wait_until(runtime.signals_heard)
        event.listen(ctx.engine, "before_cursor_execute", note)
        executor = Executor(ctx, FakeSandbox({}), run_agent=run_agent)
        executor.start()
        try:
            wait_until(lambda: looks)
            watch_quietly()
            assert len(looks) <= 2
            # A run queued (with its signal) is claimed at once...
            queued = _publish_queued(ctx)
            wait_until(lambda: _left_queue(ctx, queued))
            # ...and one held back for a second is claimed when it becomes runnable: the
            # dispatcher looks again then, not IDLE_CLAIM_SECONDS later.
            held = _publish_queued(ctx, not_before=utcnow() + timedelta(seconds=1))
            wait_until(lambda: _left_queue(ctx, held), timeout=dispatch.IDLE_CLAIM_SECONDS / 2)
        finally:
            executor.stop(grace_seconds=2)
            event.remove(ctx.engine, "before_cursor_execute", note)
