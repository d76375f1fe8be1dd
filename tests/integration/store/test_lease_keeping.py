"""A node keeps the leases of the runs it runs: its own reaper renews a live run's lapsed
lease instead of taking the run, a row another transaction has locked is not a lost lease,
and a draining node goes on renewing until its runs end. Other nodes still reap a lease
that lapsed: that is the cluster's rule."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col, select

import floom.engine.executor as executor_module
from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine.executor import Executor
from floom.engine.queue import (
    Renewal,
    claim_next_run,
    reap_expired_leases,
    renew_held_leases,
    renew_leases,
)
from floom.sandbox.fake import FakeProcess, FakeSandbox
from floom.sandbox.fence import lease_clock
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, utcnow
from tests.support.harness import fast_settings, make_worker, wait_until
from tests.support.rigs.queues import enqueue, other_node


def _expire_lease(ctx: Context, run_id: str) -> None:
    """What a heartbeat late by more than a lease leaves in the database."""
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        assert row.status == "running"
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)


def _row(ctx: Context, run_id: str) -> Run:
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
    assert row is not None
    return row


def _lease_renewed_or_run_taken(ctx: Context, run_id: str) -> bool:
    row = _row(ctx, run_id)
    assert row.lease_expires_at is not None or row.status != "running"
    return row.status != "running" or row.lease_expires_at > utcnow()  # type: ignore[operator]


# The queue


def test_a_reaper_renews_the_lapsed_leases_of_the_attempts_live_in_its_own_process(
    ctx: Context,
) -> None:
    live, stale = enqueue(ctx, 2, max_attempts=2)
    assert claim_next_run(ctx) is not None
    assert claim_next_run(ctx) is not None
    _expire_lease(ctx, live)
    _expire_lease(ctx, stale)
    # `stale` runs here as attempt 2 as far as this process knows: attempt 1's lease is not
    # one it keeps alive.
    assert reap_expired_leases(ctx, live={live: 1, stale: 2}) == 1
    kept, reaped = _row(ctx, live), _row(ctx, stale)
    assert (kept.status, kept.attempt, kept.lease_owner) == ("running", 1, ctx.node_id)
    assert kept.lease_expires_at is not None
    assert kept.lease_expires_at > utcnow()
    assert (reaped.status, reaped.attempt) == ("queued", 2)
    # Another node cannot see this process: an expired lease of it is reaped there.
    _expire_lease(ctx, live)
    other = other_node(ctx, "node-b")
    try:
        assert reap_expired_leases(other, live={live: 1}) == 1
    finally:
        other.engine.dispose()
    assert (_row(ctx, live).status, _row(ctx, live).attempt) == ("queued", 2)


def test_a_renewal_counts_the_watchdog_s_deadline_on_the_boot_clock(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored lease runs on through a suspend of the host; the monotonic clock does not.
    A renewal's deadline is counted on CLOCK_BOOTTIME, as the watchdog reads it: here after
    a (simulated) suspend, where the monotonic clock lags it by the time slept."""
    (run_id,) = enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() - 300.0)
    before = lease_clock()
    renewal = renew_held_leases(ctx, {run_id: run.lease_epoch})
    after = lease_clock()
    assert renewal.renewed == {run_id}
    assert before <= renewal.counted_from <= after


def test_a_restarted_node_reaps_its_own_runs_at_once_but_not_an_attempt_live_in_it(
    ctx: Context,
) -> None:
    left, live = enqueue(ctx, 2, max_attempts=2)
    assert claim_next_run(ctx) is not None
    assert claim_next_run(ctx) is not None
    assert reap_expired_leases(ctx, own_node_restart=True, live={live: 1}) == 1
    assert (_row(ctx, left).status, _row(ctx, live).status) == ("queued", "running")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_row_another_transaction_has_locked_is_renewed_later_never_reported_lost(
    ctx: Context,
) -> None:
    cancelled, ended, free = enqueue(ctx, 3)
    for _ in range(3):
        assert claim_next_run(ctx) is not None
    with ctx.engine.connect() as other:
        # Another node's transactions, still open: a cancel, and the run's end.
        other.execute(select(Run.id).where(col(Run.id).in_([cancelled, ended])).with_for_update())
        other.execute(update(Run).where(col(Run.id) == cancelled).values(cancel_requested=True))
        other.execute(update(Run).where(col(Run.id) == ended).values(status="succeeded"))
        assert renew_leases(ctx, [cancelled, ended, free]) == (set(), set())
        other.commit()
    # The next heartbeat gets the rows and sees what changed.
    assert renew_leases(ctx, [cancelled, ended, free]) == ({cancelled}, {ended})


# The executor


WORKER = "name: waiter\nentry: run.py\n"


class Waiter:
    """A program that runs until the test lets it end."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, p: FakeProcess) -> int:
        self.started.set()
        while not self.release.is_set():
            p.sleep(0.02)  # ends the program if the node cancels it
        p.write("result.json", json.dumps({"outputs": {}}))
        return 0


@pytest.fixture
def waiter() -> Waiter:
    return Waiter()


@pytest.fixture
def node(
    tmp_path: Path, database_url: str, waiter: Waiter, request: pytest.FixtureRequest
) -> Iterator[tuple[Context, Executor]]:
    overrides: dict[str, Any] = getattr(request, "param", {})
    ctx = Context.open(fast_settings(tmp_path / "data", database_url, **overrides))
    folder = make_worker(tmp_path / "waiter", WORKER, {"run.py": "# run by the fake\n"})
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive())
    engine = Executor(ctx, FakeSandbox({"waiter": waiter}), run_agent=run_agent)
    engine.start()
    try:
        yield ctx, engine
    finally:
        waiter.release.set()
        engine.stop(grace_seconds=5)
        ctx.engine.dispose()


def _start(ctx: Context, waiter: Waiter) -> str:
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="waiter", inputs={})
    assert waiter.started.wait(20)
    return run.id


def _ended(ctx: Context, run_id: str) -> Callable[[], Run | None]:
    def ended() -> Run | None:
        row = _row(ctx, run_id)
        return row if row.finished_at is not None else None

    return ended


# No heartbeat comes in this test: the lease lapses as behind a starved CPU or a slow write.
@pytest.mark.parametrize("node", [{"heartbeat_seconds": 3600}], indirect=True)
def test_a_run_whose_heartbeat_is_late_past_its_lease_is_not_killed_by_its_own_node(
    node: tuple[Context, Executor], waiter: Waiter
) -> None:
    ctx, _ = node
    run_id = _start(ctx, waiter)
    _expire_lease(ctx, run_id)
    # The node's reaper passes every 0.3 s.
    wait_until(lambda: _lease_renewed_or_run_taken(ctx, run_id))
    waiter.release.set()
    done = wait_until(_ended(ctx, run_id))
    assert (done.status, done.attempt, done.error_code) == ("succeeded", 1, None)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_run_whose_row_is_locked_through_heartbeats_goes_on_running(
    node: tuple[Context, Executor], waiter: Waiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, _ = node
    run_id = _start(ctx, waiter)
    renewals = []
    real = renew_held_leases

    def counted(ctx: Context, epochs: dict[str, int | None]) -> Renewal:
        result = real(ctx, epochs)
        renewals.append(list(epochs))
        return result

    monkeypatch.setattr(executor_module, "renew_held_leases", counted)
    with ctx.engine.connect() as other:
        other.execute(select(Run.id).where(Run.id == run_id).with_for_update())
        seen = len(renewals)
        wait_until(lambda: len(renewals) >= seen + 2)  # two heartbeats while it is locked
        other.commit()
    waiter.release.set()
    done = wait_until(_ended(ctx, run_id))
    assert (done.status, done.error_code) == ("succeeded", None)


def test_a_draining_node_keeps_renewing_its_runs_leases_until_they_end(
    node: tuple[Context, Executor], waiter: Waiter, caplog: pytest.LogCaptureFixture
) -> None:
    ctx, engine = node
    run_id = _start(ctx, waiter)
    caplog.set_level(logging.WARNING, logger="floom.executor")
    stopping = threading.Thread(target=engine.stop, kwargs={"grace_seconds": 60})
    stopping.start()
    try:
        wait_until(lambda: "draining: 1 run(s)" in caplog.text)
        _expire_lease(ctx, run_id)
        # Another node would take the run over once its lease lapsed; the drain renews it.
        wait_until(lambda: _lease_renewed_or_run_taken(ctx, run_id))
        other = other_node(ctx, "node-b")
        try:
            assert reap_expired_leases(other) == 0
        finally:
            other.engine.dispose()
    finally:
        waiter.release.set()
        stopping.join(timeout=30)
    done = wait_until(_ended(ctx, run_id))
    assert (done.status, done.attempt) == ("succeeded", 1)
