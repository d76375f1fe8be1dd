"""Nodes whose own clocks disagree by minutes, on one PostgreSQL: one ten minutes behind the
database's clock, one ten minutes ahead. Leases, the reaper's judgement of them and the
scheduler's ticks go by the database's clock (floom/store/db.py, DatabaseClock), so a run one
node holds is not taken by the other while it renews its lease, a lapsed lease is taken by
either once it is past its grace by the database's clock, and each tick fires once, when it
comes. SQLite is one host and one clock: these run on PostgreSQL only. The nodes are
in-process, each with its clock injected wherever floom reads the time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from floom.engine.loops import scheduler as scheduler_module
from floom.engine.loops.scheduler import Scheduler
from floom.engine.queue import claim_next, reap_expired_leases, renew_held_leases
from floom.services.context import Context
from floom.store.db import database_clock, database_now, session_scope
from floom.store.models import Run
from floom.store.triggers import Trigger, TriggerFire
from tests.support.clocks import SKEW, node_clock
from tests.support.harness import deploy_in_store, fast_settings, make_worker, wait_until
from tests.support.rigs.queues import enqueue

LEASE_SECONDS = 3.0


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite is one host: its nodes share one clock")
    context = Context.open(
        fast_settings(tmp_path / "data", database_url, lease_seconds=LEASE_SECONDS)
    )
    yield context
    context.engine.dispose()


def clock(offset: timedelta) -> AbstractContextManager[None]:
    """This node's clock, the scheduler's own reading of the system clock included."""
    return node_clock(offset, datetime_of=[scheduler_module])


def _nodes(ctx: Context) -> dict[str, tuple[Context, timedelta]]:
    return {
        "behind": (replace(ctx, node_id="behind"), -SKEW),
        "ahead": (replace(ctx, node_id="ahead"), SKEW),
    }


def _row(ctx: Context, run_id: str) -> Run:
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
        assert row is not None
        return row


def _db_now(ctx: Context) -> datetime:
    with session_scope(ctx.engine) as s:
        return database_now(s)


def test_a_run_a_node_behind_holds_is_not_reaped_by_a_node_ahead_while_it_renews(
    ctx: Context,
) -> None:
    nodes = _nodes(ctx)
    (behind, slow), (ahead, fast) = nodes["behind"], nodes["ahead"]
    (run_id,) = enqueue(ctx, 1, max_attempts=2)
    with clock(slow):
        claim = claim_next(behind)
    assert claim.run is not None
    assert claim.run.id == run_id
    epoch = claim.run.lease_epoch
    for _ in range(3):
        with clock(fast):
            assert reap_expired_leases(ahead) == 0
        with clock(slow):
            renewal = renew_held_leases(behind, {run_id: epoch})
        assert (renewal.renewed, renewal.lost) == ({run_id}, set())
    row = _row(ctx, run_id)
    assert (row.status, row.lease_owner, row.lease_epoch) == ("running", "behind", epoch)
    # The lease as stored is counted on the database's clock, not on the node's.
    assert row.lease_expires_at is not None
    left = (row.lease_expires_at - _db_now(ctx)).total_seconds()
    assert 0 < left <= LEASE_SECONDS


@pytest.mark.parametrize(("holder", "reaper"), [("behind", "ahead"), ("ahead", "behind")])
def test_a_lapsed_lease_is_reaped_by_either_node_after_its_grace_on_the_database_clock(
    ctx: Context, holder: str, reaper: str
) -> None:
    nodes = _nodes(ctx)
    (holding, holding_offset), (reaping, reaping_offset) = nodes[holder], nodes[reaper]
    (run_id,) = enqueue(ctx, 1, max_attempts=2)
    with clock(holding_offset):
        claim = claim_next(holding)
    assert claim.run is not None
    with clock(reaping_offset):
        assert reap_expired_leases(reaping) == 0  # not lapsed yet
    expires = _row(ctx, run_id).lease_expires_at
    assert expires is not None
    grace = timedelta(seconds=ctx.settings.lease_grace_seconds)

    def reaped() -> bool:
        with clock(reaping_offset):
            return reap_expired_leases(reaping) == 1

    # The holder stopped renewing: either node takes the run once the database's clock is
    # past the lease and its grace (a lease is seconds long here), not ten minutes off.
    wait_until(reaped, timeout=30)
    assert _db_now(ctx) > expires + grace
    row = _row(ctx, run_id)
    assert (row.status, row.lease_epoch) == ("queued", claim.run.lease_epoch + 1)


def _deploy_ticking(ctx: Context, folder: Path, cron: str) -> None:
    manifest = f'name: tick\ntriggers:\n  - schedule: {{cron: "{cron}", catch_up: all}}\n'
    deploy_in_store(ctx, make_worker(folder, manifest, {"run.py": "print('tick')\n"}))


def _fires(ctx: Context) -> list[tuple[datetime, str]]:
    with session_scope(ctx.engine) as s:
        rows = s.exec(select(TriggerFire.scheduled_for, TriggerFire.outcome)).all()
    return sorted((at, outcome) for at, outcome in rows)


def test_each_tick_fires_once_at_its_database_time_whichever_node_clock_is_off(
    ctx: Context, tmp_path: Path
) -> None:
    # A tick due now by the database's clock, and the next one five minutes on (due for a
    # clock ten minutes ahead, not yet for the database).
    now = _db_now(ctx)
    due = now.replace(second=0, microsecond=0)
    after = due + timedelta(minutes=5)
    _deploy_ticking(ctx, tmp_path / "w", f"{due.minute},{after.minute} * * * *")
    with session_scope(ctx.engine, write=True) as s:
        for trigger in s.exec(select(Trigger)).all():
            trigger.last_fire_at = due - timedelta(minutes=1)
            s.add(trigger)
    nodes = _nodes(ctx)
    behind, ahead = Scheduler(nodes["behind"][0]), Scheduler(nodes["ahead"][0])
    # Fired when it comes, by a node whose clock says it is ten minutes off.
    with clock(-SKEW):
        behind.tick()
    assert _fires(ctx) == [(due, "run")]
    # Once, and the next tick not before it comes, whichever node looks.
    for _ in range(2):
        for scheduler, offset in ((ahead, SKEW), (behind, -SKEW)):
            with clock(offset):
                scheduler.tick()
    assert _fires(ctx) == [(due, "run")]


def test_a_node_s_reading_of_the_database_clock_brackets_it_whatever_its_own_clock(
    ctx: Context,
) -> None:
    db_clock = database_clock(ctx.engine)
    for offset in (-SKEW, SKEW):
        with clock(offset):
            db_clock.refresh()
            for _ in range(3):
                earliest = db_clock.earliest()
                at = _db_now(ctx)
                latest = db_clock.now()
                # Never later than the database's time before it, never earlier after it.
                assert earliest <= at <= latest
                assert latest - earliest < timedelta(seconds=1)
