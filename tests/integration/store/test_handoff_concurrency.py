"""Handoff claims and dependencies under real parallel connections (threads, each on its own
pooled connection): the PostgreSQL SKIP LOCKED path, and SQLite's write lock."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.handoffs import flow
from floom.services.handoffs import jobs as handoffs
from tests.support.rigs.handoffs import admin, agent, event_types, roles

AGENTS = 8
JOBS = 200


def _race(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run `work(i)` on `count` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(count)

    def go(i: int) -> Any:
        barrier.wait(timeout=30)
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(go, range(count), timeout=120))


def test_eight_agents_racing_claim_next_over_200_jobs_claim_each_exactly_once(
    ctx: Context,
) -> None:
    roles(ctx, "worker")
    lead = agent(ctx, "lead")
    created = {
        handoffs.create_job(ctx, actor=lead, summary=f"job {i}", role="worker").row.id
        for i in range(JOBS)
    }
    team = [agent(ctx, f"agent-{i}", "worker") for i in range(AGENTS)]

    def drain(i: int) -> list[str]:
        mine = []
        while (job := flow.claim_next(ctx, actor=team[i])) is not None:
            assert job.row.assignee_agent_id == team[i].agent_id
            mine.append(job.row.id)
        return mine

    claimed = _race(AGENTS, drain)
    every = [job_id for mine in claimed for job_id in mine]
    assert len(every) == JOBS
    assert set(every) == created  # none lost, none twice
    assert sum(1 for mine in claimed if mine) > 1  # the claims were really shared out
    items, _ = handoffs.list_jobs(ctx, actor=admin(ctx), status="in_progress", limit=500)
    holders = {j.row.id: j.row.assignee_agent_id for j in items}
    for key, mine in zip(team, claimed, strict=True):
        assert all(holders[job_id] == key.agent_id for job_id in mine)
    sample = sorted(created)[:20]
    for job_id in sample:
        assert Counter(event_types(ctx, job_id))["claimed"] == 1


def test_two_blockers_completing_at_once_publish_their_dependent_exactly_once(
    ctx: Context,
) -> None:
    roles(ctx, "build", "deploy")
    lead = agent(ctx, "lead")
    builders: list[Principal] = [agent(ctx, f"builder-{i}", "build") for i in range(2)]
    rounds = 15
    pairs, dependents = [], []
    for r in range(rounds):
        a, b = (handoffs.create_job(ctx, actor=lead, summary=f"{r}", role="build") for _ in "ab")
        for builder, blocker in zip(builders, (a, b), strict=True):
            flow.claim(ctx, actor=builder, job_id=blocker.row.id)
        after = handoffs.create_job(
            ctx, actor=lead, summary=f"deploy {r}", role="deploy", blocked_by=[a.row.id, b.row.id]
        )
        assert after.row.status == "pending"
        pairs.append((a.row.id, b.row.id))
        dependents.append(after.row.id)

    for pair in pairs:

        def finish(i: int, pair: tuple[str, str] = pair) -> Any:
            return flow.complete(ctx, actor=builders[i], job_id=pair[i])

        _race(2, finish)

    boss = admin(ctx)
    for job_id in dependents:
        assert handoffs.get_job(ctx, actor=boss, job_id=job_id).row.status == "published"
        assert event_types(ctx, job_id) == ["created", "published"]


def test_publishing_a_dependent_while_its_blocker_completes_never_strands_it(
    ctx: Context,
) -> None:
    roles(ctx, "build", "deploy")
    lead, builder = agent(ctx, "lead"), agent(ctx, "builder", "build")
    for r in range(10):
        blocker = handoffs.create_job(ctx, actor=lead, summary=f"{r}", role="build")
        flow.claim(ctx, actor=builder, job_id=blocker.row.id)
        results: dict[int, handoffs.JobRecord] = {}

        def step(
            i: int,
            blocker_id: str = blocker.row.id,
            results: dict[int, handoffs.JobRecord] = results,
        ) -> None:
            if i == 0:
                flow.complete(ctx, actor=builder, job_id=blocker_id)
            else:
                results[i] = handoffs.create_job(
                    ctx, actor=lead, summary="after", role="deploy", blocked_by=[blocker_id]
                )

        _race(2, step)
        job_id = results[1].row.id
        assert handoffs.get_job(ctx, actor=lead, job_id=job_id).row.status == "published"


def test_racing_creates_with_one_idempotency_key_make_one_job(ctx: Context) -> None:
    roles(ctx, "ops")
    lead = agent(ctx, "lead")
    made = _race(
        6,
        lambda i: handoffs.create_job(
            ctx, actor=lead, summary=f"try {i}", role="ops", idempotency_key="deploy-42"
        ),
    )
    assert len({job.row.id for job in made}) == 1
    items, _ = handoffs.list_jobs(ctx, actor=lead)
    assert len(items) == 1
