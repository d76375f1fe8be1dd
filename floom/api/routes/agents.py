"""REST routes for handoff agents and roles; admins manage them, agents read them."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from floom.api.auth import AdminCaller, CtxDep, ReadCaller
from floom.api.openapi import authed
from floom.api.routing import JSONRoute
from floom.schemas import handoffs as views
from floom.schemas.admin import SCOPE_LIST
from floom.schemas.common import Page
from floom.services.handoffs import agents, retire

router = APIRouter(prefix="/api/v1", tags=["agents"], route_class=JSONRoute)


ROLE_NAME: JsonDict = {"pattern": agents.ROLE_NAME.pattern}
LABEL: JsonDict = {"minLength": 1, "maxLength": 128}
DESCRIPTION: JsonDict = {"maxLength": agents.MAX_ROLE_DESCRIPTION}
DESCRIPTION_HELP = "what agents of this role do: one line of printable text"


class RoleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    name: str = Field(json_schema_extra=ROLE_NAME, description=agents.ROLE_HINT)
    description: str = Field("", json_schema_extra=DESCRIPTION, description=DESCRIPTION_HELP)


class RoleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    name: str | None = Field(
        None, json_schema_extra=ROLE_NAME, description="the new name; jobs and agents keep it"
    )
    description: str | None = Field(
        None, json_schema_extra=DESCRIPTION, description=DESCRIPTION_HELP
    )


class AgentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    label: str = Field(json_schema_extra=LABEL)
    roles: list[str] = Field(default_factory=list, description="role names or ids")
    tool_family: str = Field("", description="e.g. claude-code, codex, floom-worker")
    scopes: list[str] = Field(
        default_factory=lambda: ["run"],
        json_schema_extra=SCOPE_LIST,
        description="of its first key",
    )


class AgentUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    roles: list[str] | None = Field(None, description="the agent's full new list of roles")
    label: str | None = Field(None, json_schema_extra=LABEL)
    tool_family: str | None = None


class AgentKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    scopes: list[str] = Field(default_factory=lambda: ["run"], json_schema_extra=SCOPE_LIST)


@router.get("/roles", response_model=Page[views.RolePublic], responses=authed(422))
def list_roles(
    ctx: CtxDep, caller: ReadCaller, include_retired: bool = False
) -> Page[views.RolePublic]:
    rows = agents.list_roles(ctx, include_retired=include_retired, caller=caller)
    items = [views.RolePublic.of(r) for r in rows]
    return Page[views.RolePublic](items=items, next_cursor=None)


@router.post(
    "/roles", status_code=201, response_model=views.RolePublic, responses=authed(400, 409, 422)
)
def create_role(body: RoleRequest, ctx: CtxDep, caller: AdminCaller) -> views.RolePublic:
    return views.RolePublic.of(
        agents.create_role(ctx, name=body.name, description=body.description, caller=caller)
    )


@router.patch(
    "/roles/{role}", response_model=views.RolePublic, responses=authed(400, 404, 409, 422)
)
def update_role(role: str, body: RoleUpdate, ctx: CtxDep, caller: AdminCaller) -> views.RolePublic:
    updated = agents.update_role(
        ctx, role=role, name=body.name, description=body.description, caller=caller
    )
    return views.RolePublic.of(updated)


@router.post("/roles/{role}/retire", response_model=views.RolePublic, responses=authed(404))
def retire_role(role: str, ctx: CtxDep, caller: AdminCaller) -> views.RolePublic:
    return views.RolePublic.of(agents.retire_role(ctx, role=role, caller=caller))


@router.get("/agents", response_model=Page[views.AgentPublic], responses=authed(422))
def list_agents(
    ctx: CtxDep, caller: ReadCaller, include_retired: bool = False
) -> Page[views.AgentPublic]:
    rows = agents.list_agents(ctx, include_retired=include_retired, caller=caller)
    items = [views.AgentPublic.of(a) for a in rows]
    return Page[views.AgentPublic](items=items, next_cursor=None)


@router.get("/agents/me", response_model=views.WhoAmI, responses=authed())
def whoami(ctx: CtxDep, caller: ReadCaller) -> views.WhoAmI:
    return views.WhoAmI.model_validate(agents.my_roles(ctx, actor=caller))


@router.post(
    "/agents",
    status_code=201,
    response_model=views.AgentCreated,
    responses=authed(400, 404, 409, 422),
)
def create_agent(body: AgentRequest, ctx: CtxDep, caller: AdminCaller) -> views.AgentCreated:
    created = agents.create_agent(
        ctx,
        label=body.label,
        roles=body.roles,
        tool_family=body.tool_family,
        scopes=body.scopes,
        caller=caller,
    )
    return views.AgentCreated.created(created)


@router.get("/agents/{agent}", response_model=views.AgentPublic, responses=authed(404))
def get_agent(agent: str, ctx: CtxDep, caller: ReadCaller) -> views.AgentPublic:
    return views.AgentPublic.of(agents.get_agent(ctx, agent=agent, caller=caller))


@router.patch(
    "/agents/{agent}", response_model=views.AgentPublic, responses=authed(400, 404, 409, 422)
)
def update_agent(
    agent: str, body: AgentUpdate, ctx: CtxDep, caller: AdminCaller
) -> views.AgentPublic:
    updated = agents.update_agent(
        ctx,
        agent=agent,
        roles=body.roles,
        label=body.label,
        tool_family=body.tool_family,
        caller=caller,
    )
    return views.AgentPublic.of(updated)


@router.post("/agents/{agent}/retire", response_model=views.AgentPublic, responses=authed(404))
def retire_agent(agent: str, ctx: CtxDep, caller: AdminCaller) -> views.AgentPublic:
    return views.AgentPublic.of(retire.retire_agent(ctx, agent=agent, caller=caller))


@router.post(
    "/agents/{agent}/keys",
    status_code=201,
    response_model=views.AgentKeyCreated,
    responses=authed(400, 404, 409, 422),
)
def create_agent_key(
    agent: str, body: AgentKeyRequest, ctx: CtxDep, caller: AdminCaller
) -> views.AgentKeyCreated:
    key, token = agents.create_agent_key(ctx, agent=agent, scopes=body.scopes, caller=caller)
    return views.AgentKeyCreated.of(key, key=token)
