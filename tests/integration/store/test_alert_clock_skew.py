"""Nodes whose own clocks disagree by minutes: one ten minutes behind the database's clock,
one ten minutes ahead, both watching and writing (floom/store/db.py db_now, the alert watch).
Each alert is recorded once, none is missed, a live node is never taken for lost, and a
delivery one node holds is not taken by the other. Both stores; the nodes in-process, each
with its clock injected where floom reads the time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import col, select

from floom.services.alerts import deliveries, watch
from floom.services.context import Context
from floom.services.ops import nodes
from floom.store.db import session_scope
from floom.store.models import AlertEvent, Delivery, Run, new_id
from floom.vocabulary import DeliveryPurpose, DeliveryStatus, RunStatus
from tests.support.clocks import SKEW
from tests.support.clocks import node_clock as clock
from tests.support.harness import fast_settings


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(fast_settings(tmp_path / "data", database_url, lease_seconds=60.0))
    yield context
    context.engine.dispose()


def _fails(ctx: Context, *, at: datetime) -> Run:
    """A run that ended failed at `at` (the time its node's clock said)."""
    run = Run(
        id=new_id("run"),
        worker_name=f"w{new_id('x')[-6:]}",
        version_id="v",
        status=RunStatus.FAILED,
        finished_at=at,
    )
    with session_scope(ctx.engine, write=True) as s:
        s.add(run)
    return run


def _events(ctx: Context) -> list[tuple[str, str]]:
    with session_scope(ctx.engine) as s:
        return [(k, v) for k, v in s.exec(select(AlertEvent.kind, AlertEvent.key)).all()]


def _two_nodes(ctx: Context) -> tuple[Context, Context]:
    behind, ahead = replace(ctx, node_id="behind"), replace(ctx, node_id="ahead")
    with clock(-SKEW):
        nodes.register(behind, slots=None)
    with clock(SKEW):
        nodes.register(ahead, slots=None)
    return behind, ahead


def test_a_node_ahead_watching_alone_sees_a_failure_a_node_behind_wrote(ctx: Context) -> None:
    behind, ahead = _two_nodes(ctx)
    pace = watch.Pace()
    with clock(SKEW):
        watch.watch(ahead, pace=pace)  # the first pass reads everything
    now = datetime.now(UTC)
    run = _fails(behind, at=now - SKEW)  # as the node behind stamps its end
    with clock(SKEW):
        watch.watch(ahead, pace=pace)
    assert [key for kind, key in _events(ctx) if kind == "run.failed"] == [f"run:{run.id}:ended"]


def test_two_nodes_ten_minutes_apart_record_each_failure_once_and_neither_is_lost(
    ctx: Context,
) -> None:
    behind, ahead = _two_nodes(ctx)
    paces = {behind.node_id: watch.Pace(), ahead.node_id: watch.Pace()}
    runs: list[Run] = []
    for n in range(8):
        for node, offset in ((behind, -SKEW), (ahead, SKEW)):
            with clock(offset):
                nodes.heartbeat(node, slots_in_use=0)
                if n % 2:
                    runs.append(_fails(node, at=datetime.now(UTC) + offset))
                watch.watch(node, pace=paces[node.node_id])
    for node, offset in ((behind, -SKEW), (ahead, SKEW)):
        with clock(offset):
            watch.watch(node, pace=paces[node.node_id])

    events = _events(ctx)
    assert sorted(key for kind, key in events if kind == "run.failed") == sorted(
        f"run:{run.id}:ended" for run in runs
    )
    assert [key for kind, key in events if kind in ("node.lost", "recovered")] == []


def test_a_delivery_claimed_by_a_node_behind_is_not_taken_by_a_node_ahead(ctx: Context) -> None:
    behind, ahead = _two_nodes(ctx)
    with session_scope(ctx.engine, write=True) as s:
        delivery = Delivery(
            id=new_id("dlv"),
            purpose=DeliveryPurpose.CALLBACK,
            target="https://receiver.invalid/hook",
            body_json="{}",
            status=DeliveryStatus.PENDING,
            max_attempts=3,
            next_attempt_at=datetime.now(UTC) - 2 * SKEW,  # due for either clock
        )
        s.add(delivery)
    with clock(-SKEW):
        assert [d.id for d in deliveries.claim_due(behind)] == [delivery.id]
    with clock(SKEW):
        assert deliveries.claim_due(ahead) == []
    with session_scope(ctx.engine) as s:
        owners = s.exec(select(Delivery.lease_owner).where(col(Delivery.id) == delivery.id)).all()
    assert owners == ["behind"]
