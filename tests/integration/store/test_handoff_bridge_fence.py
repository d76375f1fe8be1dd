"""A node whose bridge pass stalls (its process frozen) between claiming a job for a worker and
linking or finishing the job's run: the job's lease runs out, another node's pass claims it
again for the same worker (the same agent), and the stale pass, once resumed, neither links
its own run over the new one nor finishes the job with a run it is no longer bound to.

Both passes act as one agent ("worker:<name>"), so the agent's id cannot tell them apart:
the claim they act under (its claimed_at) does."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from floom.bundle import read_folder
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.handoffs import bridge, flow
from floom.services.handoffs import jobs as handoffs
from floom.services.handoffs.agents import Actor
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.store.db import database_clock, session_scope
from floom.store.handoffs import Job
from floom.store.models import Run
from tests.support.harness import make_worker
from tests.support.rigs.handoffs import agent, roles

CRITIC = """\
name: critic
inputs:
  text: {type: string, required: true}
triggers:
  - handoff: {role: reviewer}
"""


def _job_for_the_critic(ctx: Context, tmp_path: Path) -> str:
    roles(ctx, "reviewer")
    lead = agent(ctx, "lead")
    folder = make_worker(tmp_path / "critic", CRITIC, {"run.py": "print('reviewed')\n"})
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**6).to_archive())
    job = handoffs.create_job(
        ctx, actor=lead, summary="review", role="reviewer", context={"text": "x"}
    )
    return job.row.id


def _stalled_pass(ctx: Context) -> tuple[bridge.Bridge, Actor]:
    """What node A's pass holds when it stalls: its worker's bridge and agent."""
    with session_scope(ctx.engine) as s:
        [found] = bridge._bridges(s)
    return found, bridge._actor(ctx, found)


def _lease_runs_out(ctx: Context, job_id: str) -> None:
    """Node A is frozen past its lease (on the database's clock); a reaper publishes it."""
    past = database_clock(ctx.engine).now() - timedelta(minutes=1)
    with session_scope(ctx.engine, write=True) as s:
        s.execute(update(Job).where(col(Job.id) == job_id).values(lease_expires_at=past))
    assert flow.reap_expired_leases(ctx) == 1


def _job(ctx: Context, job_id: str) -> Job:
    with session_scope(ctx.engine) as s:
        found = s.get(Job, job_id)
        assert found is not None
        return found


def _runs(ctx: Context) -> dict[str, str]:
    with session_scope(ctx.engine) as s:
        return {r.id: r.status for r in s.exec(select(Run).where(Run.worker_name == "critic"))}


def test_a_stalled_pass_that_resumes_after_another_claimed_the_job_links_no_run_over_it(
    ctx: Context, tmp_path: Path
) -> None:
    job_id = _job_for_the_critic(ctx, tmp_path)
    found, actor = _stalled_pass(ctx)
    taken = flow.claim_next(ctx, actor=actor)  # node A's claim, then A is frozen
    assert taken is not None
    _lease_runs_out(ctx, job_id)
    assert bridge.tick(ctx) == 1  # node B's pass claims it again and starts its run
    current = _job(ctx, job_id)
    assert current.status == "in_progress"
    assert current.run_id is not None
    bound = current.run_id

    bridge._start(ctx, found, actor, taken.row)  # node A resumes where it stopped

    after = _job(ctx, job_id)
    assert (after.status, after.run_id, after.claimed_at) == (
        "in_progress",
        bound,
        current.claimed_at,
    )
    # A's run was made before A could know: it is cancelled, not left to run unlinked.
    [stale] = [r for r in _runs(ctx) if r != bound]
    assert _runs(ctx) == {bound: "queued", stale: "cancelled"}


@pytest.mark.parametrize("run_1", ["cancelled", "still queued"])
def test_a_stalled_pass_that_resumes_after_another_claimed_the_job_does_not_finish_it(
    ctx: Context, tmp_path: Path, run_1: str
) -> None:
    job_id = _job_for_the_critic(ctx, tmp_path)
    _, actor = _stalled_pass(ctx)
    assert bridge.tick(ctx) == 1  # node A's pass claims and starts run 1
    stale = _job(ctx, job_id)  # ...then its next pass reads the job, and A is frozen
    assert stale.run_id is not None
    if run_1 == "cancelled":
        runs.cancel_run(ctx, run_id=stale.run_id, caller=SYSTEM)
    _lease_runs_out(ctx, job_id)
    assert bridge.tick(ctx) == 1  # node B's pass claims it again and starts run 2
    current = _job(ctx, job_id)
    assert current.run_id not in (None, stale.run_id)

    # Node A resumes: run 1 ended, so it would fail the job with it; or still queued, so it
    # would renew the lease of a claim that is B's.
    with pytest.raises(flow.NotHolder, match="claimed again"):
        bridge._finish(ctx, actor, stale)

    after = _job(ctx, job_id)
    assert (after.status, after.run_id, after.reason) == ("in_progress", current.run_id, None)
