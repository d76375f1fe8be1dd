"""Retiring an agent: its keys are revoked and the jobs it holds go back to `published`, in
one transaction. It stands apart from agents.py because it needs the job flow (flow.py),
which itself builds on agents.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import col, select

from floom.services.access import keys
from floom.services.access.principal import Principal
from floom.services.handoffs.agents import AgentRoles, agent_roles, find_agent
from floom.services.handoffs.flow import release_jobs_of_agent
from floom.store.db import session_scope
from floom.store.models import ApiKey, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context


def retire_agent(ctx: Context, *, agent: str, caller: Principal) -> AgentRoles:
    """Retire an agent: its keys are revoked and the jobs it holds go back to `published`.
    Needs the admin scope (checked again in the retiring transaction)."""
    caller.require("admin")
    revoked: list[str] = []
    with session_scope(ctx.engine, write=True) as s:
        found = find_agent(s, agent)
        live = s.exec(select(ApiKey.id).where(ApiKey.agent_id == found.id)).all()
        keys.lock_keys(s, [*live, caller.key_id])
        caller.require_in(s, "admin")
        if found.retired_at is None:
            now = utcnow()
            found.retired_at = now
            s.add(found)
            for key in s.exec(
                select(ApiKey).where(ApiKey.agent_id == found.id, col(ApiKey.revoked_at).is_(None))
            ).all():
                key.revoked_at = now
                s.add(key)
                keys.announce_revoked(s, key.key_hash)
                revoked.append(key.key_hash)
            release_jobs_of_agent(s, agent_id=found.id, reason=f"agent {found.label} retired")
        result = agent_roles(s, found)
    for key_hash in revoked:
        keys.forget_key(ctx, key_hash)
    return result
