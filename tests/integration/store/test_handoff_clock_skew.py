"""Handoff job leases with the nodes' own clocks ten minutes apart, on one PostgreSQL: an
agent's claim, heartbeat and finish may each reach a different node, and any node's reaper
returns lapsed jobs. Leases are written and judged on the database's clock
(floom/services/handoffs/flow.py), so a job held is not taken again by a node ahead, and a
lapsed one is not left stuck by a node behind. SQLite is one host and one clock: PostgreSQL
only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.handoffs import flow
from floom.services.handoffs import jobs as handoffs
from floom.store.db import database_now, session_scope
from floom.store.handoffs import Job
from tests.support.clocks import SKEW, node_clock
from tests.support.harness import fast_settings, wait_until
from tests.support.rigs.handoffs import agent, event_types, roles

OFFSETS = {"behind": -SKEW, "ahead": SKEW}


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite is one host: its nodes share one clock")
    context = Context.open(fast_settings(tmp_path / "data", database_url))
    yield context
    context.engine.dispose()


def _job(ctx: Context) -> tuple[str, Principal]:
    roles(ctx, "worker")
    lead, worker = agent(ctx, "lead"), agent(ctx, "worker", "worker")
    return handoffs.create_job(ctx, actor=lead, summary="s", role="worker").row.id, worker


def _row(ctx: Context, job_id: str) -> Job:
    with session_scope(ctx.engine) as s:
        row = s.get(Job, job_id)
        assert row is not None
        return row


@pytest.mark.parametrize(("holder", "other"), [("behind", "ahead"), ("ahead", "behind")])
def test_a_job_claimed_through_one_node_is_held_while_heartbeats_reach_the_other(
    ctx: Context, holder: str, other: str
) -> None:
    job_id, worker = _job(ctx)
    with node_clock(OFFSETS[holder]):
        flow.claim(ctx, actor=worker, job_id=job_id, lease_seconds=60)
    for _ in range(2):
        with node_clock(OFFSETS[other]):
            assert flow.reap_expired_leases(ctx) == 0
            flow.heartbeat(ctx, actor=worker, job_id=job_id, lease_seconds=60)
        with node_clock(OFFSETS[holder]):
            assert flow.reap_expired_leases(ctx) == 0
    with node_clock(OFFSETS[other]):
        flow.complete(ctx, actor=worker, job_id=job_id, summary="done")
    assert _row(ctx, job_id).status == "completed"
    assert "lease_expired" not in event_types(ctx, job_id)


@pytest.mark.parametrize(("holder", "reaper"), [("behind", "ahead"), ("ahead", "behind")])
def test_a_lapsed_job_lease_is_returned_by_either_node_once_past_on_the_database_clock(
    ctx: Context, holder: str, reaper: str
) -> None:
    job_id, worker = _job(ctx)
    with node_clock(OFFSETS[holder]):
        flow.claim(ctx, actor=worker, job_id=job_id, lease_seconds=2)
    expires = _row(ctx, job_id).lease_expires_at
    assert expires is not None
    with session_scope(ctx.engine) as s:
        left = (expires - database_now(s)).total_seconds()
    assert 0 < left <= 2  # counted on the database's clock, not on the node's

    def returned() -> bool:
        with node_clock(OFFSETS[reaper]):
            return flow.reap_expired_leases(ctx) == 1

    # Within seconds of the lease's end, not ten (or twenty) minutes off it.
    wait_until(returned, timeout=30)
    with session_scope(ctx.engine) as s:
        assert database_now(s) > expires
    row = _row(ctx, job_id)
    assert (row.status, row.assignee_agent_id) == ("published", None)
    with node_clock(OFFSETS[holder]), pytest.raises(flow.NotHolder):
        flow.heartbeat(ctx, actor=worker, job_id=job_id)
