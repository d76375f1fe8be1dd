"""A run queued while this node's executor has a free slot is taken in the queueing
transaction itself (no claim of its own): never ahead of an older runnable run, never for a
limited worker, and a held slot is always given back when the run is not taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine import dispatch as dispatch_module
from floom.engine import queue as queue_module
from floom.engine.executor import Executor
from floom.engine.queue import Claim, claim_next
from floom.engine.runtime import NodeRuntime
from floom.errors import FloomError
from floom.sandbox.fake import FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs.logs import list_events
from floom.services.workers import versions as workers
from floom.store.models import Run, Version
from tests.support.harness import fast_settings, make_worker, wait_until
from tests.support.rigs.queues import commits, enqueue, is_claim, is_end


class Slots(NodeRuntime):
    """A stand-in node whose executor has `free` slots, recording the runs it started."""

    def __init__(self, free: int, *, node_id: str) -> None:
        super().__init__()
        self.free = free
        self.held = 0
        self.started: list[Run] = []
        self.node_id = node_id

    @contextmanager
    def slot_for(self, run: Run, version: Version, *, start_ahead: bool) -> Iterator[bool]:
        if self.free - self.held <= 0:
            yield False
            return
        self.held += 1
        try:
            yield True
        finally:
            self.held -= 1
        if run.status == "running" and run.lease_owner == self.node_id:
            self.free -= 1
            self.started.append(run)


def deploy(ctx: Context, tmp_path: Path, name: str, extra: str = "") -> None:
    folder = make_worker(tmp_path / name, f"name: {name}\n{extra}", {"run.py": "print('hi')\n"})
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    workers.deploy(ctx, caller=SYSTEM, archive=archive)


def given_slots(ctx: Context, *, free: int) -> Slots:
    """This node's executor, as the queue's writers see it, with `free` slots."""
    ctx.node = slots = Slots(free, node_id=ctx.node_id)
    return slots


def lines(ctx: Context, run_id: str) -> list[str]:
    return [e.line for e in list_events(ctx, run_id=run_id, caller=SYSTEM)]


def test_a_free_slot_takes_the_run_in_the_queueing_transaction(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path, "w1")
    slots = given_slots(ctx, free=1)

    run = runs.create_run(ctx, worker_name="w1", caller=SYSTEM)

    stored = runs.get_run(ctx, run_id=run.id, caller=SYSTEM)
    assert (stored.status, stored.lease_owner) == ("running", ctx.node_id)
    assert stored.lease_expires_at is not None
    assert stored.started_at is not None
    assert [r.id for r in slots.started] == [run.id]
    assert slots.held == 0
    assert lines(ctx, run.id) == [
        f"queued (api) on version {stored.version_id}",
        f"started attempt 1 of 1 on {ctx.node_id}",
    ]
    # The dispatcher is not woken for a run nobody needs to claim.
    assert not slots.queued.is_set()

    # No slot left: the next run is queued for the dispatcher, and the slot was not held.
    second = runs.create_run(ctx, worker_name="w1", caller=SYSTEM)
    assert runs.get_run(ctx, run_id=second.id, caller=SYSTEM).status == "queued"
    assert slots.queued.is_set()
    assert len(slots.started) == 1
    assert slots.held == 0


def test_a_run_never_jumps_ahead_of_an_older_runnable_run(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path, "w1")
    (older,) = enqueue(ctx, 1)
    slots = given_slots(ctx, free=4)

    run = runs.create_run(ctx, worker_name="w1", caller=SYSTEM)

    assert runs.get_run(ctx, run_id=run.id, caller=SYSTEM).status == "queued"
    assert runs.get_run(ctx, run_id=older, caller=SYSTEM).status == "queued"
    assert slots.started == []
    assert slots.held == 0


def test_a_limited_workers_run_and_an_agents_child_run_go_through_the_queue(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path, "limited", "concurrency: 1\n")
    deploy(ctx, tmp_path, "plain")
    slots = given_slots(ctx, free=4)

    limited = runs.create_run(ctx, worker_name="limited", caller=SYSTEM)
    child = runs.create_run(ctx, worker_name="plain", caller=SYSTEM, parent_run_id=limited.id)

    for run in (limited, child):
        assert runs.get_run(ctx, run_id=run.id, caller=SYSTEM).status == "queued"
    assert slots.started == []
    assert slots.held == 0


def test_a_refused_queueing_gives_the_held_slot_back_and_stores_nothing(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path, "w1")
    slots = given_slots(ctx, free=1)

    def refuse(_s: Session, _run: Run) -> None:
        raise FloomError("the trigger's own step failed")

    with pytest.raises(FloomError):
        runs.create_run(ctx, worker_name="w1", caller=SYSTEM, in_transaction=refuse)

    assert slots.held == 0
    assert slots.started == []
    page, _ = runs.list_runs(ctx, caller=SYSTEM)
    assert page == []


def test_a_triggers_step_decides_before_the_run_is_taken(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path, "w1")
    slots = given_slots(ctx, free=4)

    def queue_overlapping(_s: Session, run: Run) -> None:
        run.concurrency = 1  # as a schedule with `overlap: queue` does

    def plain(_s: Session, run: Run) -> None:
        run.trigger_id = None

    limited = runs.create_run(
        ctx, worker_name="w1", caller=SYSTEM, in_transaction=queue_overlapping
    )
    assert runs.get_run(ctx, run_id=limited.id, caller=SYSTEM).status == "queued"
    assert slots.started == []
    assert slots.held == 0

    # With the queued run cancelled out of the way, a run whose step limits nothing is taken.
    runs.cancel_run(ctx, run_id=limited.id, caller=SYSTEM)
    taken = runs.create_run(ctx, worker_name="w1", caller=SYSTEM, in_transaction=plain)
    stored = runs.get_run(ctx, run_id=taken.id, caller=SYSTEM)
    assert (stored.status, stored.lease_owner) == ("running", ctx.node_id)
    assert [r.id for r in slots.started] == [taken.id]
    assert lines(ctx, taken.id)[1] == f"started attempt 1 of 1 on {ctx.node_id}"


def test_a_run_taken_as_the_node_stops_is_requeued_not_lost(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path, "w1")
    engine = Executor(ctx, FakeSandbox(), run_agent=run_agent)
    engine.start()
    assert engine.runtime.dispatch is engine.dispatch
    # The slot is held, the run committed as this node's, and the node stops before the run
    # reaches its slot: a drain that ran out (grace 0) shut the slots down meanwhile.
    assert engine.dispatch.reserve()
    ctx.node = Slots(free=1, node_id=ctx.node_id)
    run = runs.create_run(ctx, worker_name="w1", caller=SYSTEM)
    assert run.status == "running"
    engine.stop(grace_seconds=0)
    assert engine.runtime.dispatch is None

    engine.dispatch.start_claimed(run)

    stored = runs.get_run(ctx, run_id=run.id, caller=SYSTEM)
    assert stored.status == "queued"
    assert stored.previous_attempt == "interrupted"
    assert "interrupted by node shutdown; requeued" in lines(ctx, run.id)


def test_a_slot_goes_on_to_the_next_queued_run_itself(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a burst, the slot whose run just ended claims the next queued run and runs it in
    # its own thread: the dispatcher is not woken and no run is handed to another thread.
    # On SQLite that claim is made in the end's own write transaction (queue.NextClaim):
    # the four runs cost five write transactions that end or take a run, not eight.
    ctx = Context.open(fast_settings(tmp_path / "data", database_url, executor_slots=1))
    deploy(ctx, tmp_path, "w1")
    ids = [runs.create_run(ctx, worker_name="w1", caller=SYSTEM).id for _ in range(4)]
    claimed_on: list[str] = []
    real_claim = claim_next
    real_end = queue_module._claim_with_end

    def recording_claim(c: Context, **kwargs: Any) -> Claim:
        claim = real_claim(c, **kwargs)
        if claim.run is not None:
            claimed_on.append(threading.current_thread().name)
        return claim

    def recording_end_claim(*args: Any) -> Claim | None:
        claim = real_end(*args)
        if claim is not None and claim.run is not None:
            claimed_on.append(threading.current_thread().name)
        return claim

    monkeypatch.setattr(dispatch_module, "claim_next", recording_claim)
    monkeypatch.setattr(queue_module, "_claim_with_end", recording_end_claim)
    engine = Executor(ctx, FakeSandbox({"run.py": lambda p: 0}), run_agent=run_agent)
    with commits(ctx) as committed:
        engine.start()
        try:
            wait_until(
                lambda: (
                    {runs.get_run(ctx, run_id=i, caller=SYSTEM).status for i in ids}
                    == {"succeeded"}
                ),
                timeout=30,
            )
        finally:
            engine.stop()
    ctx.engine.dispose()
    assert len(claimed_on) == 4
    assert claimed_on[0] == "floom-dispatch"  # the queue's first run: nothing ran yet
    assert all(name.startswith("floom-run") for name in claimed_on[1:]), claimed_on
    # The transactions that ended a run or took one (a claim that found nothing, as the
    # dispatcher's may once the queue is empty, writes no line).
    ends_and_claims = [
        t
        for t in committed
        if any(map(is_end, t))
        or (any(map(is_claim, t)) and any(x.startswith("INSERT INTO run_events") for x in t))
    ]
    folded = [t for t in ends_and_claims if any(map(is_claim, t)) and any(map(is_end, t))]
    if ctx.engine.dialect.name == "postgresql":
        assert (len(ends_and_claims), len(folded)) == (8, 0)
    else:
        assert (len(ends_and_claims), len(folded)) == (5, 3), ends_and_claims
