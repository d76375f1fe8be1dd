"""Handoff jobs through the service layer, on SQLite and PostgreSQL: publishing, claims,
visibility, idempotency, edits, status changes, routing, rejection and leases."""

from __future__ import annotations

from typing import Any

import pytest

from floom.errors import Conflict, Forbidden, IllegalTransition, InvalidRequest, NotFound
from floom.services.access import keys
from floom.services.access.principal import SYSTEM, Principal
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import flow, review
from floom.services.handoffs import jobs as handoffs
from floom.services.handoffs.retire import retire_agent
from floom.store.models import utcnow
from tests.support.harness import wait_until
from tests.support.rigs.handoffs import admin, agent, event_types, events, label_of, public, roles

# The team's keys by part, as a surface passes them on.
Team = dict[str, Principal]


@pytest.fixture
def team(ctx: Context) -> Team:
    roles(ctx, "coder", "reviewer", "ops")
    return {
        "lead": agent(ctx, "lead"),
        "coder": agent(ctx, "coder-1", "coder"),
        "coder2": agent(ctx, "coder-2", "coder"),
        "reviewer": agent(ctx, "reviewer-1", "reviewer"),
        "admin": admin(ctx),
    }


def test_a_published_job_is_claimed_by_a_holder_of_its_role_and_every_step_is_audited(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(
        ctx,
        actor=team["lead"],
        summary="fix the flaky test",
        role="coder",
        context={"repo": "floom", "test": "test_x"},
        constraints=["no new dependencies"],
        artifacts=[{"type": "file", "uri": "s3://b/log.txt", "checksum": "sha256:ab"}],
        priority="high",
    )
    assert job.row.status == "published"
    assert label_of(job, job.row.source_agent_id) == "lead"
    claimed = flow.claim(ctx, actor=team["coder"], job_id=job.row.id)
    assert claimed.row.status == "in_progress"
    assert label_of(claimed, claimed.row.assignee_agent_id) == "coder-1"
    assert claimed.row.lease_expires_at is not None
    done = flow.complete(
        ctx, actor=team["coder"], job_id=job.row.id, summary="fixed", data={"pr": 7}
    )
    assert done.row.status == "completed"
    assert public(done).result == {"summary": "fixed", "data": {"pr": 7}, "artifacts": []}
    trail = events(ctx, job.row.id)
    assert [(e.type, e.from_status, e.to_status) for e in trail] == [
        ("created", None, "published"),
        ("claimed", "published", "in_progress"),
        ("completed", "in_progress", "completed"),
    ]
    assert trail[1].actor == "agent coder-1"


def test_claim_next_takes_the_most_urgent_then_the_oldest_job_of_the_callers_roles(
    ctx: Context, team: Team
) -> None:
    lead = team["lead"]
    old_low = handoffs.create_job(ctx, actor=lead, summary="a", role="coder", priority="low")
    old_high = handoffs.create_job(ctx, actor=lead, summary="b", role="coder", priority="high")
    handoffs.create_job(ctx, actor=lead, summary="ops", role="ops", priority="urgent")
    new_high = handoffs.create_job(ctx, actor=lead, summary="c", role="coder", priority="high")
    order = [flow.claim_next(ctx, actor=team["coder"]) for _ in range(4)]
    assert [j.row.id if j else None for j in order] == [
        old_high.row.id,
        new_high.row.id,
        old_low.row.id,
        None,
    ]


def test_claim_next_for_a_role_the_caller_does_not_hold_is_refused(
    ctx: Context, team: Team
) -> None:
    with pytest.raises(Forbidden) as info:
        flow.claim_next(ctx, actor=team["coder"], role="reviewer")
    assert "coder" in (info.value.hint or "")
    assert flow.claim_next(ctx, actor=team["lead"]) is None  # no roles, nothing to take


def test_a_held_job_cannot_be_claimed_by_another_agent(ctx: Context, team: Team) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    flow.claim(ctx, actor=team["coder"], job_id=job.row.id)
    with pytest.raises(Conflict) as info:
        flow.claim(ctx, actor=team["coder2"], job_id=job.row.id)
    assert "held by another agent" in info.value.message
    held = handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id)
    assert label_of(held, held.row.assignee_agent_id) == "coder-1"


def test_agents_see_jobs_of_their_roles_and_ones_they_created_or_hold_admins_see_all(
    ctx: Context, team: Team
) -> None:
    lead, coder, reviewer = team["lead"], team["coder"], team["reviewer"]
    code = handoffs.create_job(ctx, actor=lead, summary="code", role="coder")
    ops = handoffs.create_job(ctx, actor=lead, summary="ops", role="ops")
    own = handoffs.create_job(ctx, actor=reviewer, summary="mine", role="ops")

    def ids(actor: object) -> set[str]:
        items, _ = handoffs.list_jobs(ctx, actor=actor)  # type: ignore[arg-type]
        return {j.row.id for j in items}

    assert ids(coder) == {code.row.id}
    assert ids(reviewer) == {own.row.id}
    assert ids(lead) == {code.row.id, ops.row.id}
    assert ids(team["admin"]) == {code.row.id, ops.row.id, own.row.id}
    with pytest.raises(NotFound):
        handoffs.get_job(ctx, actor=coder, job_id=ops.row.id)
    with pytest.raises(NotFound):
        flow.claim(ctx, actor=coder, job_id=ops.row.id)
    # Holding a job keeps it visible after the holder loses the role.
    flow.claim(ctx, actor=coder, job_id=code.row.id)
    handoff_agents.update_agent(ctx, caller=SYSTEM, agent="coder-1", roles=["reviewer"])
    assert ids(coder) == {code.row.id}
    mine, _ = handoffs.list_jobs(ctx, actor=coder, assignee="me")
    assert [j.row.id for j in mine] == [code.row.id]


def test_an_agents_roles_are_read_on_every_call_never_frozen(ctx: Context, team: Team) -> None:
    key = team["lead"]  # the same key object throughout, as a long-lived client would hold
    job = handoffs.create_job(ctx, actor=key, summary="x", role="ops")
    assert flow.claim_next(ctx, actor=key) is None
    handoff_agents.update_agent(ctx, caller=SYSTEM, agent="lead", roles=["ops"])
    assert handoff_agents.my_roles(ctx, actor=handoff_agents.as_actor(ctx, key))["roles"] == ["ops"]
    handoff_agents.update_role(ctx, caller=SYSTEM, role="ops", name="operations")
    claimed = flow.claim_next(ctx, actor=key, role="operations")
    assert claimed is not None
    assert claimed.row.id == job.row.id
    assert claimed.role == "operations"


def test_the_same_idempotency_key_from_the_same_agent_returns_the_first_job(
    ctx: Context, team: Team
) -> None:
    first = handoffs.create_job(
        ctx, actor=team["lead"], summary="deploy", role="ops", idempotency_key="TICKET-1"
    )
    again = handoffs.create_job(
        ctx, actor=team["lead"], summary="deploy (retry)", role="ops", idempotency_key="TICKET-1"
    )
    assert again.row.id == first.row.id
    assert again.replayed is True
    assert again.row.summary == "deploy"
    other = handoffs.create_job(
        ctx, actor=team["coder"], summary="deploy", role="ops", idempotency_key="TICKET-1"
    )
    assert other.row.id != first.row.id
    items, _ = handoffs.list_jobs(ctx, actor=team["admin"])
    assert len(items) == 2
    assert event_types(ctx, first.row.id) == ["created"]


def test_only_the_source_or_an_admin_edits_context_before_completion_old_and_new_audited(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(
        ctx, actor=team["lead"], summary="x", role="coder", context={"v": 1}, constraints=["a"]
    )
    flow.claim(ctx, actor=team["coder"], job_id=job.row.id)
    with pytest.raises(Forbidden):
        handoffs.update_job(ctx, actor=team["coder"], job_id=job.row.id, context={"v": 9})
    updated = handoffs.update_job(
        ctx, actor=team["lead"], job_id=job.row.id, context={"v": 2}, constraints=["a", "b"]
    )
    assert public(updated).context == {"v": 2}
    assert public(updated).constraints == ["a", "b"]
    handoffs.update_job(ctx, actor=team["admin"], job_id=job.row.id, constraints=["c"])
    change = events(ctx, job.row.id)[-2]
    assert change.type == "updated"
    assert change.payload["context"] == {"old": {"v": 1}, "new": {"v": 2}}
    assert change.payload["constraints"] == {"old": ["a"], "new": ["a", "b"]}
    flow.complete(ctx, actor=team["coder"], job_id=job.row.id)
    with pytest.raises(Conflict):
        handoffs.update_job(ctx, actor=team["lead"], job_id=job.row.id, context={"v": 3})
    assert public(handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id)).context == {"v": 2}


def test_an_illegal_status_change_is_refused_lists_the_allowed_and_changes_nothing(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    with pytest.raises(IllegalTransition) as info:
        flow.set_status(ctx, actor=team["admin"], job_id=job.row.id, status="blocked")
    assert info.value.details["allowed"] == ["in_progress", "cancelled"]
    with pytest.raises(Forbidden):  # a bystander holding the role may not cancel
        flow.set_status(ctx, actor=team["coder"], job_id=job.row.id, status="cancelled")
    assert handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id).row.status == "published"
    assert event_types(ctx, job.row.id) == ["created"]


def test_an_assignee_blocks_unblocks_and_releases_a_job(ctx: Context, team: Team) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    coder = team["coder"]
    flow.set_status(ctx, actor=coder, job_id=job.row.id, status="in_progress")  # a claim
    blocked = flow.set_status(
        ctx, actor=coder, job_id=job.row.id, status="blocked", reason="need creds"
    )
    assert blocked.row.status == "blocked"
    assert blocked.row.reason == "need creds"
    assert blocked.row.lease_expires_at is None
    back = flow.set_status(ctx, actor=coder, job_id=job.row.id, status="in_progress")
    assert back.row.status == "in_progress"
    assert label_of(back, back.row.assignee_agent_id) == "coder-1"
    released = flow.set_status(ctx, actor=coder, job_id=job.row.id, status="published")
    assert public(released).assignee is None
    assert event_types(ctx, job.row.id) == [
        "created",
        "claimed",
        "blocked",
        "unblocked",
        "released",
    ]
    assert events(ctx, job.row.id)[2].payload["reason"] == "need creds"


def test_completion_publishes_follow_on_jobs_whose_condition_holds(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(
        ctx,
        actor=team["lead"],
        summary="write the fix",
        role="coder",
        routing=[
            {"role": "reviewer", "summary": "review the fix", "priority": "urgent"},
            {"role": "ops", "condition": {"path": "data.deploy", "equals": True}},
            {"role": "ops", "condition": {"path": "data.tests", "gte": 10}, "summary": "ship"},
        ],
    )
    flow.claim(ctx, actor=team["coder"], job_id=job.row.id)
    artifact = {"type": "git", "uri": "git://floom@abc123"}
    flow.complete(
        ctx,
        actor=team["coder"],
        job_id=job.row.id,
        summary="done",
        data={"tests": 12},
        artifacts=[artifact],
    )
    follow_ons, _ = handoffs.list_jobs(ctx, actor=team["admin"], status="published")
    by_summary = {j.row.summary: j for j in follow_ons}
    assert set(by_summary) == {"review the fix", "ship"}
    review_job = by_summary["review the fix"]
    assert review_job.row.follow_on_of == job.row.id
    assert review_job.row.priority == "urgent"
    assert review_job.role == "reviewer"
    assert public(review_job).artifacts[0]["uri"] == artifact["uri"]
    assert public(review_job).context["previous_job"]["result"]["data"] == {"tests": 12}
    assert event_types(ctx, job.row.id) == [
        "created",
        "claimed",
        "completed",
        "routed",
        "routing_skipped",
        "routed",
    ]


def test_reject_makes_a_linked_retry_and_reopen_context_collects_every_reason(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(
        ctx,
        actor=team["lead"],
        summary="add caching",
        role="coder",
        context={"big": "x" * 1000},
        constraints=["keep the API"],
        artifacts=[{"type": "doc", "uri": "s3://b/spec.md"}],
        routing=[{"role": "reviewer"}],
    )
    coder, reviewer = team["coder"], team["reviewer"]
    flow.claim(ctx, actor=coder, job_id=job.row.id)
    with pytest.raises(Conflict):  # unfinished work is failed or cancelled, not rejected
        review.reject(ctx, actor=team["lead"], job_id=job.row.id, reason="no")
    flow.complete(
        ctx, actor=coder, job_id=job.row.id, artifacts=[{"type": "pr", "uri": "gh://pr/1"}]
    )
    with pytest.raises(NotFound):  # the reviewer holds no follow-on yet, so cannot see it
        review.reject(ctx, actor=reviewer, job_id=job.row.id, reason="no tests")
    review_job = flow.claim_next(ctx, actor=reviewer)
    assert review_job is not None
    assert review_job.row.follow_on_of == job.row.id
    assert handoffs.get_job(ctx, actor=reviewer, job_id=job.row.id).row.id == job.row.id
    retry = review.reject(ctx, actor=reviewer, job_id=job.row.id, reason="no tests")
    assert retry.row.retry_of == job.row.id
    assert retry.row.attempt == 2
    assert retry.row.status == "published"
    assert retry.role == "coder"
    assert retry.row.rejection_reason == "no tests"
    assert label_of(retry, retry.row.rejected_by) == "reviewer-1"
    assert [a["uri"] for a in public(retry).artifacts] == ["s3://b/spec.md", "gh://pr/1"]
    assert public(retry).context == {"big": "x" * 1000}
    original = handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id)
    assert original.row.status == "completed"
    assert original.row.superseded_by == retry.row.id
    with pytest.raises(Conflict):
        review.reject(ctx, actor=team["lead"], job_id=job.row.id, reason="again")

    flow.claim(ctx, actor=team["coder2"], job_id=retry.row.id)
    flow.complete(ctx, actor=team["coder2"], job_id=retry.row.id)
    third = review.reject(ctx, actor=team["lead"], job_id=retry.row.id, reason="still slow")
    context = review.reopen_context(ctx, actor=team["coder"], job_id=third.row.id)
    assert context["original_job_id"] == job.row.id
    assert context["summary"] == "add caching"
    assert context["constraints"] == ["keep the API"]
    assert context["attempt"] == 3
    assert [(r["attempt"], r["reason"]) for r in context["rejections"]] == [
        (1, "no tests"),
        (2, "still slow"),
    ]
    assert context["rejections"][0]["reviewer"] == "reviewer-1"
    assert "context" not in context
    assert event_types(ctx, job.row.id)[-1] == "rejected"


def test_a_job_waits_for_every_blocker_then_publishes_once(ctx: Context, team: Team) -> None:
    lead, coder = team["lead"], team["coder"]
    a = handoffs.create_job(ctx, actor=lead, summary="a", role="coder")
    b = handoffs.create_job(ctx, actor=lead, summary="b", role="coder")
    after = handoffs.create_job(
        ctx, actor=lead, summary="after", role="ops", blocked_by=[a.row.id, b.row.id]
    )
    assert after.row.status == "pending"
    assert after.blocked_by == sorted([a.row.id, b.row.id])
    with pytest.raises(IllegalTransition):
        flow.claim(ctx, actor=agent(ctx, "ops-1", "ops"), job_id=after.row.id)
    for blocker in (a, b):
        flow.claim(ctx, actor=coder, job_id=blocker.row.id)
        flow.complete(ctx, actor=coder, job_id=blocker.row.id)
        status = handoffs.get_job(ctx, actor=lead, job_id=after.row.id).row.status
        assert status == ("published" if blocker is b else "pending")
    assert event_types(ctx, after.row.id) == ["created", "published"]
    done = handoffs.create_job(ctx, actor=lead, summary="late", role="ops", blocked_by=[a.row.id])
    assert done.row.status == "published"


def test_a_failed_blocker_fails_its_dependents_down_the_chain_with_the_reason(
    ctx: Context, team: Team
) -> None:
    lead, coder = team["lead"], team["coder"]
    a = handoffs.create_job(ctx, actor=lead, summary="a", role="coder")
    b = handoffs.create_job(ctx, actor=lead, summary="b", role="ops", blocked_by=[a.row.id])
    c = handoffs.create_job(ctx, actor=lead, summary="c", role="ops", blocked_by=[b.row.id])
    flow.claim(ctx, actor=coder, job_id=a.row.id)
    flow.set_status(ctx, actor=coder, job_id=a.row.id, status="failed", reason="disk full")
    for dep in (b, c):
        body = handoffs.get_job(ctx, actor=lead, job_id=dep.row.id)
        assert body.row.status == "failed"
        assert "disk full" in (body.row.reason or "")
    assert events(ctx, c.row.id)[-1].payload["blocker"] == b.row.id
    with pytest.raises(Conflict):
        handoffs.create_job(ctx, actor=lead, summary="d", role="ops", blocked_by=[a.row.id])


def test_a_cancelled_pending_job_fails_its_own_dependents(ctx: Context, team: Team) -> None:
    lead = team["lead"]
    a = handoffs.create_job(ctx, actor=lead, summary="a", role="coder")
    b = handoffs.create_job(ctx, actor=lead, summary="b", role="ops", blocked_by=[a.row.id])
    c = handoffs.create_job(ctx, actor=lead, summary="c", role="ops", blocked_by=[b.row.id])
    flow.set_status(ctx, actor=lead, job_id=b.row.id, status="cancelled", reason="not needed")
    assert handoffs.get_job(ctx, actor=lead, job_id=c.row.id).row.status == "failed"
    assert handoffs.get_job(ctx, actor=lead, job_id=a.row.id).row.status == "published"


def test_an_expired_lease_returns_the_job_to_published_and_the_late_holder_is_told(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    flow.claim(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=0.2)
    wait_until(lambda: flow.reap_expired_leases(ctx) == 1, timeout=10)
    body = handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id)
    assert body.row.status == "published"
    assert public(body).assignee is None
    expiry = events(ctx, job.row.id)[-1]
    assert expiry.type == "lease_expired"
    assert expiry.actor == "lease reaper"
    assert expiry.payload["previous_assignee"] == team["coder"].agent_id
    with pytest.raises(flow.NotHolder):
        flow.complete(ctx, actor=team["coder"], job_id=job.row.id)
    with pytest.raises(flow.NotHolder):
        flow.heartbeat(ctx, actor=team["coder"], job_id=job.row.id)
    again = flow.claim_next(ctx, actor=team["coder2"])
    assert again is not None
    assert again.row.id == job.row.id


def test_a_holder_whose_lease_ran_out_cannot_complete_or_heartbeat_before_the_reaper_runs(
    ctx: Context, team: Team
) -> None:
    # The lease is checked under the row lock, not left to the reaper: a late holder is
    # refused (409, lease_expired) and the job stays as it was, for the reaper to publish.
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    claimed = flow.claim(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=0.2)
    expires = claimed.row.lease_expires_at
    assert expires is not None
    wait_until(lambda: utcnow() > expires, timeout=10)
    with pytest.raises(flow.LeaseExpired) as late:
        flow.heartbeat(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=300)
    assert late.value.status == 409
    assert "returned to the queue" in late.value.message
    with pytest.raises(flow.LeaseExpired):
        flow.complete(ctx, actor=team["coder"], job_id=job.row.id, summary="late")
    for status in ("completed", "blocked", "published", "failed"):
        with pytest.raises(flow.LeaseExpired):
            flow.set_status(ctx, actor=team["coder"], job_id=job.row.id, status=status)
    row = handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id).row
    assert (row.status, row.lease_expires_at) == ("in_progress", expires)
    assert flow.reap_expired_leases(ctx) == 1
    assert handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id).row.status == "published"


def test_a_heartbeat_extends_the_lease_so_the_reaper_leaves_the_job(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    claimed = flow.claim(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=0.5)
    beat = flow.heartbeat(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=300)
    assert claimed.row.lease_expires_at is not None
    assert beat["lease_expires_at"] > claimed.row.lease_expires_at
    with pytest.raises(flow.NotHolder):
        flow.heartbeat(ctx, actor=team["coder2"], job_id=job.row.id)
    with pytest.raises(InvalidRequest):
        flow.heartbeat(ctx, actor=team["coder"], job_id=job.row.id, lease_seconds=0)
    assert flow.reap_expired_leases(ctx) == 0


def test_retiring_an_agent_revokes_its_keys_and_publishes_the_jobs_it_held(
    ctx: Context, team: Team
) -> None:
    job = handoffs.create_job(ctx, actor=team["lead"], summary="x", role="coder")
    flow.claim(ctx, actor=team["coder"], job_id=job.row.id)
    retire_agent(ctx, caller=SYSTEM, agent="coder-1")
    body = handoffs.get_job(ctx, actor=team["lead"], job_id=job.row.id)
    assert body.row.status == "published"
    assert public(body).assignee is None
    assert events(ctx, job.row.id)[-1].payload["reason"] == "agent coder-1 retired"
    with pytest.raises(Forbidden):
        flow.claim_next(ctx, actor=team["coder"])
    coder_keys = [
        k for k in keys.list_keys(ctx, caller=SYSTEM) if k.agent_id == team["coder"].agent_id
    ]
    assert coder_keys
    assert all(k.revoked_at is not None for k in coder_keys)


def test_a_retired_role_takes_no_new_jobs_and_its_holders_lose_it(ctx: Context, team: Team) -> None:
    handoff_agents.retire_role(ctx, caller=SYSTEM, role="ops")
    with pytest.raises(Conflict) as info:
        handoffs.create_job(ctx, actor=team["lead"], summary="x", role="ops")
    assert "retired" in info.value.message
    assert "ops" not in [r.name for r in handoff_agents.list_roles(ctx, caller=SYSTEM)]


def test_a_key_that_speaks_for_no_agent_cannot_take_part(ctx: Context, team: Team) -> None:
    _, token = keys.create_key(ctx, caller=SYSTEM, scopes=["run"], name="plain")
    plain = Principal.of_key(keys.authenticate(ctx, token))
    with pytest.raises(Forbidden) as info:
        handoffs.create_job(ctx, actor=plain, summary="x", role="ops")
    assert "agents create" in (info.value.hint or "")
    with pytest.raises(Forbidden):  # an admin key without an agent cannot hold a job
        flow.claim_next(ctx, actor=team["admin"])


def test_bad_job_parts_are_refused_and_create_nothing(ctx: Context, team: Team) -> None:
    lead = team["lead"]
    bad: dict[str, Any]
    for bad in (
        {"summary": " "},
        {"priority": "asap"},
        {"role": "nobody"},
        {"artifacts": [{"uri": "x"}]},
        {"routing": [{"role": "reviewer", "condition": "x == 1"}]},
        {"routing": [{"role": "nobody"}]},
        {"blocked_by": ["job_missing"]},
    ):
        args: dict[str, Any] = {"summary": "ok", "role": "coder", **bad}
        with pytest.raises((InvalidRequest, NotFound)):
            handoffs.create_job(ctx, actor=lead, **args)
    items, _ = handoffs.list_jobs(ctx, actor=team["admin"])
    assert items == []


def test_an_agent_with_an_unknown_scope_is_refused_and_nothing_is_created(ctx: Context) -> None:
    handoff_agents.create_role(ctx, caller=SYSTEM, name="writer")
    with pytest.raises(InvalidRequest):
        handoff_agents.create_agent(
            ctx, caller=SYSTEM, label="half", roles=["writer"], scopes=["root"]
        )
    assert [a.agent.label for a in handoff_agents.list_agents(ctx, caller=SYSTEM)] == []
    # The label is free: nothing half-made holds it.
    made = handoff_agents.create_agent(
        ctx, caller=SYSTEM, label="half", roles=["writer"], scopes=["run"]
    )
    assert made.agent.label == "half"
