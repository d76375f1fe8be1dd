"""Helpers for the handoff tests: agents with keys, and reading a job's audit trail."""

from __future__ import annotations

from floom.schemas.handoffs import JobEventPublic, JobPublic
from floom.services.access import keys
from floom.services.access.principal import SCOPES, SYSTEM, Principal
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import jobs as handoffs
from floom.views import handoffs as handoff_views


def roles(ctx: Context, *names: str) -> None:
    for name in names:
        handoff_agents.create_role(ctx, caller=SYSTEM, name=name)


def agent(ctx: Context, label: str, *role_names: str, scopes: list[str] | None = None) -> Principal:
    """A new agent holding `role_names`; returns its API key as a surface passes it on."""
    body = handoff_agents.create_agent(
        ctx, caller=SYSTEM, label=label, roles=list(role_names), scopes=scopes
    )
    return Principal.of_key(keys.authenticate(ctx, body.token))


def agent_keys_by_scope(ctx: Context, label: str) -> dict[str, str]:
    """A new agent `label` holding a new role of the same name, and a key of its for each
    scope: their tokens by scope."""
    roles(ctx, label)
    body = handoff_agents.create_agent(ctx, caller=SYSTEM, label=label, roles=[label])
    return {
        scope: handoff_agents.create_agent_key(
            ctx, caller=SYSTEM, agent=body.agent.id, scopes=[scope]
        )[1]
        for scope in SCOPES
    }


def admin(ctx: Context) -> Principal:
    _, token = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="test admin")
    return Principal.of_key(keys.authenticate(ctx, token))


def public(found: handoffs.JobRecord) -> JobPublic:
    """A job as the web UI shows it: its JSON read back, its agents by label."""
    return handoff_views.stored_job(found)


def label_of(found: handoffs.JobRecord, agent_id: str | None) -> str | None:
    """The label of an agent the job names (its source, assignee or reviewer)."""
    return None if agent_id is None else found.labels.get(agent_id, agent_id)


def events(ctx: Context, job_id: str) -> list[JobEventPublic]:
    return [
        JobEventPublic.of(e) for e in handoffs.list_events(ctx, actor=admin_actor(), job_id=job_id)
    ]


def event_types(ctx: Context, job_id: str) -> list[str]:
    return [e.type for e in events(ctx, job_id)]


def admin_actor() -> handoff_agents.Actor:
    return handoff_agents.system_actor("test")
