"""Agents and roles of the handoff layer, and who a request acts as (its Actor).

An agent's roles are read from the database on every call, so a role granted, renamed or
retired takes effect on the next request of every agent, with no restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom.errors import Conflict, Forbidden, InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.services import names
from floom.services.access import keys
from floom.services.access.principal import Principal
from floom.store.db import session_scope
from floom.store.handoffs import Agent, AgentRole, Role
from floom.store.models import ApiKey, new_id, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

ROLE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ROLE_HINT = "a role name is lower case letters, digits, '.', '_' or '-', e.g. reviewer"
# A role's description is shown to agents and in `floom roles list`, on one line.
MAX_ROLE_DESCRIPTION = 1000
# Agents labelled "worker:<name>" are the workers that take jobs through handoff triggers.
WORKER_PREFIX = "worker:"


@dataclass(frozen=True)
class Actor:
    """Who is acting: an agent (with the roles it holds right now), an admin, or floom."""

    key_id: str | None
    agent_id: str | None
    label: str
    admin: bool
    roles: dict[str, str]  # role id -> role name, active roles only
    system: bool = False
    # The claim this actor acts under (the job's claimed_at when it was read), or None for
    # the agent's every claim. A worker's bridge acts as one agent on every node: a pass that
    # stalled (its node frozen) past its lease, while another node's pass claimed the job
    # again, is told from that one by its claim, and refused (flow._check_lease).
    claim: datetime | None = None

    @property
    def role_ids(self) -> set[str]:
        return set(self.roles)

    def describe(self) -> str:
        if self.system:
            return self.label or "floom"
        return f"agent {self.label}" if self.agent_id else f"admin key {self.key_id}"


def system_actor(label: str = "floom", *, agent_id: str | None = None) -> Actor:
    return Actor(key_id=None, agent_id=agent_id, label=label, admin=True, roles={}, system=True)


def as_actor(ctx: Context, actor: Actor | Principal | ApiKey, *, scope: str = "read") -> Actor:
    """Surfaces pass the request's caller, which must hold `scope` (what the handoff service
    asking does needs); its agent and roles are read now. An Actor is floom's own, already
    resolved, and passes."""
    if isinstance(actor, Actor):
        return actor
    caller = actor if isinstance(actor, Principal) else Principal.of_key(actor)
    caller.require(scope)
    return actor_for_key(ctx, key=caller)


def actor_for_key(ctx: Context, *, key: Principal) -> Actor:
    """The actor behind a caller's API key, with its agent's roles as they are now.

    Raises Forbidden for a key that speaks for no agent and is not an admin key, and for
    the key of a retired agent.
    """
    if key.system:
        return system_actor(key.name or "floom", agent_id=key.agent_id)
    admin = key.can("admin")
    if key.agent_id is None:
        if not admin:
            raise Forbidden(
                "this API key speaks for no agent, so it cannot take part in handoffs",
                hint=told(
                    "create an agent with ",
                    act("agents create", name="NAME", role="ROLE"),
                    " and use its key",
                ),
            )
        return Actor(key_id=key.key_id, agent_id=None, label="", admin=True, roles={})
    with session_scope(ctx.engine) as s:
        agent = s.get(Agent, key.agent_id)
        if agent is None or agent.retired_at is not None:
            raise Forbidden(
                "this API key's agent was retired",
                hint=told("an admin can create a new agent with ", act("agents create")),
            )
        roles = roles_of(s, agent.id)
    return Actor(
        key_id=key.key_id,
        agent_id=agent.id,
        label=agent.label,
        admin=admin,
        roles={r.id: r.name for r in roles},
    )


def roles_of(s: Session, agent_id: str) -> list[Role]:
    q = (
        select(Role)
        .join(AgentRole, col(AgentRole.role_id) == col(Role.id))
        .where(AgentRole.agent_id == agent_id, col(Role.retired_at).is_(None))
        .order_by(col(Role.name))
    )
    return list(s.exec(q).all())


# -- roles -----------------------------------------------------------------------------------


def find_role(s: Session, ref: str, *, active: bool = True) -> Role:
    """A role by id or name; with `active`, a retired role is refused."""
    role = s.get(Role, ref) if ref.startswith("rol_") else None
    role = role or s.exec(select(Role).where(Role.name == ref)).first()
    if role is None:
        raise NotFound(f"no role '{quoted(ref)}'", hint=told(act("roles list"), " shows the roles"))
    if active and role.retired_at is not None:
        raise Conflict(
            f"the role '{role.name}' is retired",
            hint=told("pick an active role (", act("roles list"), ")"),
        )
    return role


def _check_role_name(name: str) -> str:
    if not isinstance(name, str) or not ROLE_NAME.fullmatch(name):
        shown = quoted(name) if isinstance(name, str) else type(name).__name__
        raise InvalidRequest(f"'{shown}' is not a valid role name", hint=ROLE_HINT)
    return name


def _check_description(description: str) -> str:
    # One line of printable text: a newline or a terminal escape in it would print a line
    # of its own in a listing, or move the reader's cursor.
    return names.check_text_name(
        description, field="description", most=MAX_ROLE_DESCRIPTION, kept_as="a description"
    )


def create_role(ctx: Context, *, name: str, description: str = "", caller: Principal) -> Role:
    """A new role agents can hold and jobs can target. Needs the admin scope."""
    caller.require("admin")
    role = Role(
        id=new_id("rol"), name=_check_role_name(name), description=_check_description(description)
    )
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "admin")
            s.add(role)
    except IntegrityError as exc:
        raise Conflict(
            f"a role named '{name}' exists", hint="pick another name or reuse that role"
        ) from exc
    return role


def list_roles(ctx: Context, *, include_retired: bool = False, caller: Principal) -> list[Role]:
    """The roles by name, the retired ones too with `include_retired`. Needs the read scope."""
    caller.require("read")
    q = select(Role).order_by(col(Role.name))
    if not include_retired:
        q = q.where(col(Role.retired_at).is_(None))
    with session_scope(ctx.engine) as s:
        return list(s.exec(q).all())


def update_role(
    ctx: Context,
    *,
    role: str,
    name: str | None = None,
    description: str | None = None,
    caller: Principal,
) -> Role:
    """Rename a role or change its description; jobs and agents keep it, by id. Needs the
    admin scope."""
    caller.require("admin")
    if description is not None:
        _check_description(description)
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "admin")
            found = find_role(s, role, active=False)
            if name is not None:
                found.name = _check_role_name(name)
            if description is not None:
                found.description = description
            s.add(found)
            s.flush()
    except IntegrityError as exc:
        raise Conflict(f"a role named '{name}' exists", hint="pick another name") from exc
    return found


def retire_role(ctx: Context, *, role: str, caller: Principal) -> Role:
    """No new jobs target a retired role and its holders lose it; its jobs stay as they are.
    Needs the admin scope."""
    caller.require("admin")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "admin")
        found = find_role(s, role, active=False)
        if found.retired_at is None:
            found.retired_at = utcnow()
            s.add(found)
    return found


# -- agents ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentRoles:
    """An agent with the active roles it holds, by name (schemas.handoffs.AgentPublic.of)."""

    agent: Agent
    roles: list[Role]


@dataclass(frozen=True)
class NewAgent(AgentRoles):
    """A new agent and its first key, with the key's plaintext (shown only once)."""

    key: ApiKey
    token: str


def agent_roles(s: Session, agent: Agent) -> AgentRoles:
    return AgentRoles(agent, roles_of(s, agent.id))


def find_agent(s: Session, ref: str) -> Agent:
    agent = s.get(Agent, ref) if ref.startswith("agt_") else None
    agent = agent or s.exec(select(Agent).where(Agent.label == ref)).first()
    if agent is None:
        raise NotFound(
            f"no agent '{quoted(ref)}'", hint=told(act("agents list"), " shows the agents")
        )
    return agent


def _check_label(label: str) -> str:
    if not isinstance(label, str) or not label.strip() or len(label) > 128:
        raise InvalidRequest(
            "an agent needs a label of 1 to 128 characters", hint="e.g. claude-laptop"
        )
    names.check_text_name(label, field="label", most=128)
    if label.strip().startswith(WORKER_PREFIX):
        raise InvalidRequest(
            f"labels starting with '{WORKER_PREFIX}' are floom's own",
            hint="workers with a handoff trigger act as these agents; pick another label",
        )
    return label.strip()


def _set_roles(s: Session, agent_id: str, roles: list[str]) -> list[Role]:
    found = {r.id: r for r in (find_role(s, ref) for ref in roles)}
    for link in s.exec(select(AgentRole).where(AgentRole.agent_id == agent_id)).all():
        s.delete(link)
    s.flush()
    for role_id in found:
        s.add(AgentRole(agent_id=agent_id, role_id=role_id))
    return sorted(found.values(), key=lambda r: r.name)


def _key_name(label: str) -> str:
    # A key's name holds 128 characters, a label as many: the key names the agent in short.
    return f"agent {label}"[: keys.MAX_NAME_CHARS]


def create_agent(
    ctx: Context,
    *,
    label: str,
    roles: list[str],
    tool_family: str = "",
    scopes: list[str] | None = None,
    caller: Principal,
) -> NewAgent:
    """Create an agent holding `roles`, and its first API key (its plaintext shown only now),
    in one transaction. Bad scopes are refused before anything is written. Needs the admin
    scope (checked again in that transaction)."""
    caller.require("admin")
    scopes = scopes or ["run"]
    keys.check_scopes(scopes)
    agent = Agent(
        id=new_id("agt"),
        label=_check_label(label),
        tool_family=names.check_text_name(tool_family, field="tool_family", most=40),
    )
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "admin")
            s.add(agent)
            s.flush()
            held = _set_roles(s, agent.id, roles)
            key, token = keys.add_key(
                s, scopes=scopes, name=_key_name(agent.label), agent_id=agent.id, caller=caller
            )
    except IntegrityError as exc:
        raise Conflict(f"an agent labelled '{label}' exists", hint="pick another label") from exc
    return NewAgent(agent, held, key, token)


def create_agent_key(
    ctx: Context, *, agent: str, scopes: list[str] | None = None, caller: Principal
) -> tuple[ApiKey, str]:
    """Another key for an agent (to rotate one), with its plaintext, shown only now.
    Needs the admin scope (checked again in the inserting transaction)."""
    caller.require("admin")
    scopes = scopes or ["run"]
    keys.check_scopes(scopes)
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "admin")
        found = find_agent(s, agent)
        if found.retired_at is not None:
            raise Conflict(f"agent '{found.label}' is retired", hint="create a new agent instead")
        key, token = keys.add_key(
            s, scopes=scopes, name=_key_name(found.label), agent_id=found.id, caller=caller
        )
    return key, token


def list_agents(
    ctx: Context, *, include_retired: bool = False, caller: Principal
) -> list[AgentRoles]:
    """The agents by label with their roles. Needs the read scope."""
    caller.require("read")
    q = select(Agent).order_by(col(Agent.label))
    if not include_retired:
        q = q.where(col(Agent.retired_at).is_(None))
    with session_scope(ctx.engine) as s:
        return [agent_roles(s, a) for a in s.exec(q).all()]


def get_agent(ctx: Context, *, agent: str, caller: Principal) -> AgentRoles:
    """One agent (by id or label) with its roles. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        found = find_agent(s, agent)
        return agent_roles(s, found)


def update_agent(
    ctx: Context,
    *,
    agent: str,
    roles: list[str] | None = None,
    label: str | None = None,
    tool_family: str | None = None,
    caller: Principal,
) -> AgentRoles:
    """Change an agent's roles (the full new list), label or tool family. Needs the admin
    scope."""
    caller.require("admin")
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "admin")
            found = find_agent(s, agent)
            if found.retired_at is not None:
                raise Conflict(f"agent '{found.label}' is retired", hint="it cannot change")
            if label is not None:
                found.label = _check_label(label)
            if tool_family is not None:
                found.tool_family = names.check_text_name(tool_family, field="tool_family", most=40)
            s.add(found)
            if roles is not None:
                _set_roles(s, found.id, roles)
            s.flush()
            return agent_roles(s, found)
    except IntegrityError as exc:
        raise Conflict(f"an agent labelled '{label}' exists", hint="pick another label") from exc


def my_roles(ctx: Context, *, actor: Actor | Principal) -> dict[str, Any]:
    """Who the caller is and the roles it holds now (read per call, never cached)."""
    who = as_actor(ctx, actor)
    return {
        "agent": None if who.agent_id is None else {"id": who.agent_id, "label": who.label},
        "admin": who.admin,
        "roles": sorted(who.roles.values()),
    }
