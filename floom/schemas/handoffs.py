"""Handoff jobs, their audit events, roles and agents, as answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict, JsonValue

from floom.schemas.admin import KeyCreated
from floom.schemas.common import JobPriorityWord, JobStatusWord, Public, Timestamp
from floom.services.handoffs import rules

if TYPE_CHECKING:
    from floom.services.handoffs.agents import AgentRoles, NewAgent
    from floom.store.handoffs import Role

# A request's status or priority, checked by the service (floom/services/handoffs/rules.py).
JOB_STATUS: JsonDict = {"enum": list(rules.STATUSES)}
PRIORITY: JsonDict = {"enum": list(rules.PRIORITIES)}


class AgentRef(Public):
    id: str
    label: str


class Rejection(Public):
    reason: str
    reviewer: AgentRef | None


class JobEventPublic(Public):
    id: int
    job_id: str
    ts: Timestamp
    type: str
    from_status: JobStatusWord | None
    to_status: JobStatusWord | None
    actor: str | None
    actor_agent_id: str | None
    payload: dict[str, Any]


class JobPublic(Public):
    """A handoff job. `replayed` is there when an idempotency key returned an earlier job;
    `events` when asked for."""

    id: str
    summary: str
    status: JobStatusWord
    priority: JobPriorityWord
    role: str
    role_id: str
    context: dict[str, Any]
    constraints: list[str]
    artifacts: list[dict[str, Any]]
    routing: list[dict[str, Any]]
    blocked_by: list[str]
    source_agent: AgentRef | None
    assignee: AgentRef | None
    idempotency_key: str | None
    claimed_at: Timestamp | None
    lease_expires_at: Timestamp | None
    result: Any
    reason: str | None
    follow_on_of: str | None
    retry_of: str | None
    superseded_by: str | None
    attempt: int
    run_id: str | None
    rejection: Rejection | None
    created_at: Timestamp
    updated_at: Timestamp
    finished_at: Timestamp | None
    replayed: bool = False
    events: list[JobEventPublic] = Field(default_factory=list)

    omit_when_unset = frozenset({"replayed", "events"})


class JobQuery(BaseModel):
    """Which handoff jobs to list: the ones the caller may see, newest first, a page at a time.
    The one shape of GET /api/v1/handoffs/jobs's filters, the client's list_jobs, both MCP
    backends and the handoff_list_jobs tool, and `floom handoffs jobs`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: list[str] | None = Field(None, description="only jobs in these statuses")
    role: str | None = None
    assignee: str | None = Field(None, description='an agent id or label, or "me"')
    source: str | None = Field(None, description='an agent id or label, or "me"')
    my_roles: bool = Field(False, description="only jobs for roles the caller holds")
    cursor: str | None = None
    limit: int = 50

    def params(self) -> dict[str, Any]:
        """As REST query parameters: the statuses comma-joined, unset ones left out."""
        body = self.model_dump(exclude_none=True, exclude={"status", "my_roles"})
        if self.status:
            body["status"] = ",".join(self.status)
        if self.my_roles:
            body["my_roles"] = True
        return body


class ClaimNextResult(Public):
    job: JobPublic | None = Field(description="null when no job is waiting for your roles")


class LeaseState(Public):
    id: str
    status: JobStatusWord
    lease_expires_at: Timestamp | None


class ReopenRejection(Public):
    attempt: int
    rejected_job: str | None
    retry_job: str
    reason: str | None
    reviewer: str | None
    rejected_at: Timestamp


class ReopenContext(Public):
    job_id: str
    original_job_id: str
    status: JobStatusWord
    summary: str
    constraints: list[str]
    attempt: int
    rejections: list[ReopenRejection]


class TransitionTable(Public):
    statuses: list[str]
    transitions: dict[str, dict[str, list[str]]] = Field(
        description="from status, to status, the parties that may make the move"
    )


class WhoAmI(Public):
    agent: AgentRef | None
    admin: bool
    roles: list[str]


class RolePublic(Public):
    id: str
    name: str
    description: str
    created_at: Timestamp
    retired_at: Timestamp | None

    @classmethod
    def of(cls, role: Role, /) -> Self:
        return cls(
            id=role.id,
            name=role.name,
            description=role.description,
            created_at=role.created_at,
            retired_at=role.retired_at,
        )


class AgentPublic(Public):
    id: str
    label: str
    tool_family: str
    roles: list[str]
    created_at: Timestamp
    retired_at: Timestamp | None

    @classmethod
    def of(cls, held: AgentRoles, /, **extra: Any) -> Self:
        agent = held.agent
        return cls(
            id=agent.id,
            label=agent.label,
            tool_family=agent.tool_family,
            roles=[r.name for r in held.roles],
            created_at=agent.created_at,
            retired_at=agent.retired_at,
            **extra,
        )


class AgentCreated(AgentPublic):
    key: str = Field(description="the agent's first key: shown only in this answer")
    key_id: str

    @classmethod
    def created(cls, new: NewAgent, /) -> Self:
        return cls.of(new, key=new.token, key_id=new.key.id)


AgentKeyCreated = KeyCreated


CONDITION_REF: JsonDict = {"$ref": "#/components/schemas/HandoffCondition"}
_OPERAND: dict[str, JsonDict] = {
    "equals": {},
    "not_equals": {},
    "in": {"type": "array"},
    "contains": {},
    "exists": {"type": "boolean"},
    **{op: {"type": "number"} for op in ("gt", "gte", "lt", "lte")},
}
#: A routing rule's condition as services/handoffs/rules.py checks it (nesting up to
#: MAX_CONDITION_DEPTH): a path with one operator, or all / any / not of conditions.
_VARIANTS: list[JsonValue] = [
    {
        "type": "object",
        "required": [group],
        "additionalProperties": False,
        "properties": {group: {"type": "array", "minItems": 1, "items": CONDITION_REF}},
    }
    for group in ("all", "any")
]
_VARIANTS.append(
    {
        "type": "object",
        "required": ["not"],
        "additionalProperties": False,
        "properties": {"not": CONDITION_REF},
    }
)
_VARIANTS.extend(
    {
        "type": "object",
        "required": ["path", op],
        "additionalProperties": False,
        "properties": {"path": {"type": "string", "minLength": 1}, op: operand},
    }
    for op, operand in _OPERAND.items()
)
CONDITION: JsonDict = {
    "description": 'e.g. {"path": "data.verdict", "equals": "approve"}',
    "oneOf": _VARIANTS,
}
