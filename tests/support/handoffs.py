"""Helpers for the handoff tests: agents with keys, and reading a job's audit trail."""

from __future__ import annotations

from typing import Any

from floom.services.access import keys
from floom.services.access.principal import SYSTEM, Principal
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import jobs as handoffs


def roles(ctx: Context, *names: str) -> None:
    for name in names:
        handoff_agents.create_role(ctx, caller=SYSTEM, name=name)


def agent(ctx: Context, label: str, *role_names: str, scopes: list[str] | None = None) -> Principal:
    """A new agent holding `role_names`; returns its API key as a surface passes it on."""
    body = handoff_agents.create_agent(
        ctx, caller=SYSTEM, label=label, roles=list(role_names), scopes=scopes
    )
    return Principal.of_key(keys.authenticate(ctx, body.token))


def admin(ctx: Context) -> Principal:
    _, token = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="test admin")
    return Principal.of_key(keys.authenticate(ctx, token))


def events(ctx: Context, job_id: str) -> list[dict[str, Any]]:
    return handoffs.list_events(ctx, actor=admin_actor(), job_id=job_id)


def event_types(ctx: Context, job_id: str) -> list[str]:
    return [e["type"] for e in events(ctx, job_id)]


def admin_actor() -> handoff_agents.Actor:
    return handoff_agents.system_actor("test")
