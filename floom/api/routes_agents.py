"""REST routes for handoff agents and roles; admins manage them, agents read them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from floom.api.auth import AdminKey, CtxDep, ReadKey
from floom.services import handoff_agents as agents

router = APIRouter(prefix="/api/v1", tags=["agents"])


class RoleRequest(BaseModel):
    name: str
    description: str = ""


class RoleUpdate(BaseModel):
    name: str | None = Field(None, description="the new name; jobs and agents keep the role")
    description: str | None = None


class AgentRequest(BaseModel):
    label: str
    roles: list[str] = Field(default_factory=list, description="role names")
    tool_family: str = Field("", description="e.g. claude-code, codex, floom-worker")
    scopes: list[str] = Field(default_factory=lambda: ["run"], description="of its first key")


class AgentUpdate(BaseModel):
    roles: list[str] | None = Field(None, description="the agent's full new list of roles")
    label: str | None = None
    tool_family: str | None = None


class AgentKeyRequest(BaseModel):
    scopes: list[str] = Field(default_factory=lambda: ["run"])


@router.get("/roles")
def list_roles(ctx: CtxDep, _: ReadKey, include_retired: bool = False) -> dict[str, Any]:
    return {"items": agents.list_roles(ctx, include_retired=include_retired), "next_cursor": None}


@router.post("/roles", status_code=201)
def create_role(body: RoleRequest, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.create_role(ctx, name=body.name, description=body.description)


@router.patch("/roles/{role}")
def update_role(role: str, body: RoleUpdate, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.update_role(ctx, role=role, name=body.name, description=body.description)


@router.post("/roles/{role}/retire")
def retire_role(role: str, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.retire_role(ctx, role=role)


@router.get("/agents")
def list_agents(ctx: CtxDep, _: ReadKey, include_retired: bool = False) -> dict[str, Any]:
    items = agents.list_agents(ctx, include_retired=include_retired)
    return {"items": items, "next_cursor": None}


@router.get("/agents/me")
def whoami(ctx: CtxDep, key: ReadKey) -> dict[str, Any]:
    return agents.my_roles(ctx, actor=key)


@router.post("/agents", status_code=201)
def create_agent(body: AgentRequest, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.create_agent(
        ctx, label=body.label, roles=body.roles, tool_family=body.tool_family, scopes=body.scopes
    )


@router.get("/agents/{agent}")
def get_agent(agent: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    return agents.get_agent(ctx, agent=agent)


@router.patch("/agents/{agent}")
def update_agent(agent: str, body: AgentUpdate, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.update_agent(
        ctx, agent=agent, roles=body.roles, label=body.label, tool_family=body.tool_family
    )


@router.post("/agents/{agent}/retire")
def retire_agent(agent: str, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.retire_agent(ctx, agent=agent)


@router.post("/agents/{agent}/keys", status_code=201)
def create_agent_key(agent: str, body: AgentKeyRequest, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return agents.create_agent_key(ctx, agent=agent, scopes=body.scopes)
