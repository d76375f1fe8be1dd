"""Handoff jobs, their audit events, roles and agents, as answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict, JsonValue

from floom import jsonvalues
from floom.schemas.admin import KeyCreated
from floom.schemas.common import JobPriorityWord, JobStatusWord, Public, Timestamp
from floom.services.handoffs import rules

if TYPE_CHECKING:
    from floom.services.handoffs.agents import AgentRoles, NewAgent
    from floom.services.handoffs.jobs import JobRecord
    from floom.store.handoffs import JobEvent, Role

# A request's status or priority, checked by the service (floom/services/handoffs/rules.py).
JOB_STATUS: JsonDict = {"enum": list(rules.STATUSES)}
PRIORITY: JsonDict = {"enum": list(rules.PRIORITIES)}


class AgentRef(Public):
    id: str
    label: str

    @classmethod
    def named(cls, agent_id: str | None, labels: dict[str, str]) -> Self | None:
        """The agent `agent_id` with its label from `labels` (its id when it has none)."""
        if agent_id is None:
            return None
        return cls(id=agent_id, label=labels.get(agent_id, agent_id))


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

    @classmethod
    def of(cls, event: JobEvent, /, *, payload: dict[str, Any] | None = None) -> Self:
        """The event; `payload` in place of its stored one (a surface tells its reason)."""
        return cls(
            id=event.id,
            job_id=event.job_id,
            ts=event.ts,
            type=event.type,
            from_status=event.from_status,
            to_status=event.to_status,
            actor=event.actor,
            actor_agent_id=event.actor_agent_id,
            payload=stored_payload(event) if payload is None else payload,
        )


def stored_payload(event: JobEvent) -> dict[str, Any]:
    payload: dict[str, Any] = jsonvalues.stored(event.payload_json, expect=dict)
    return payload


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

    @classmethod
    def of(cls, found: JobRecord, /, *, reason: str | None, events: list[JobEventPublic]) -> Self:
        """The job; `reason` and `events` as told on the caller's surface (floom.views)."""
        job, labels = found.row, found.labels
        rejection = None
        if job.rejection_reason is not None:
            reviewer = AgentRef.named(job.rejected_by, labels)
            rejection = Rejection(reason=job.rejection_reason, reviewer=reviewer)
        given: dict[str, Any] = {}  # replayed and events appear only when there
        if found.replayed:
            given["replayed"] = True
        if events:
            given["events"] = events
        return cls(
            id=job.id,
            summary=job.summary,
            status=job.status,
            priority=job.priority,
            role=found.role,
            role_id=job.target_role_id,
            context=jsonvalues.stored(job.context_json, expect=dict),
            constraints=jsonvalues.stored_list(job.constraints_json, items=str),
            artifacts=rules.job_artifacts(job.artifacts_json),
            routing=found.routing,
            blocked_by=found.blocked_by,
            source_agent=AgentRef.named(job.source_agent_id, labels),
            assignee=AgentRef.named(job.assignee_agent_id, labels),
            idempotency_key=job.idempotency_key,
            claimed_at=job.claimed_at,
            lease_expires_at=job.lease_expires_at,
            result=jsonvalues.stored(job.result_json) if job.result_json else None,
            reason=reason,
            follow_on_of=job.follow_on_of,
            retry_of=job.retry_of,
            superseded_by=job.superseded_by,
            attempt=job.attempt,
            run_id=job.run_id,
            rejection=rejection,
            created_at=job.created_at,
            updated_at=job.updated_at,
            finished_at=job.finished_at,
            **given,
        )


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


# -- requests ------------------------------------------------------------------------------------

# What the handoff rules (services/handoffs/rules.py) check, stated for clients; the services
# still decide, and answer 400 with a hint for a body that breaks one of these.
TEXT: JsonDict = {"pattern": r"\S"}
ARTIFACTS: JsonDict = {
    "maxItems": rules.MAX_ARTIFACTS,
    "items": {
        "type": "object",
        "required": ["type", "uri"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "pattern": r"\S"},
            "uri": {"type": "string", "pattern": r"\S"},
            "checksum": {"type": ["string", "null"]},
            "metadata": {"type": ["object", "null"]},
        },
    },
}
CONSTRAINTS: JsonDict = {"maxItems": rules.MAX_CONSTRAINTS}
ROUTING: JsonDict = {
    "maxItems": rules.MAX_RULES,
    "items": {
        "type": "object",
        "required": ["role"],
        "additionalProperties": False,
        "properties": {
            "role": {"type": "string"},
            "summary": {"type": ["string", "null"], "pattern": r"\S"},
            "priority": {"enum": [*rules.PRIORITIES, None]},
            "context": {"type": ["object", "null"]},
            "constraints": {"type": ["array", "null"], "items": {"type": "string"}},
            "condition": {"anyOf": [CONDITION_REF, {"type": "null"}]},
        },
    },
}


class JobRequest(BaseModel):
    """A job to publish: the one shape of POST /api/v1/handoffs/jobs's body, the handoff
    client's create_job, both MCP backends and the handoff_create_job tool, and `floom
    handoffs create`."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused

    summary: str = Field(json_schema_extra=TEXT)
    role: str = Field(description="the target role's name", json_schema_extra={"minLength": 1})
    context: dict[str, Any] = Field(default_factory=dict)
    constraints: list[str] = Field(default_factory=list, json_schema_extra=CONSTRAINTS)
    artifacts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="each {type, uri, checksum?, metadata?}",
        json_schema_extra=ARTIFACTS,
    )
    priority: str = Field("normal", json_schema_extra=PRIORITY)
    blocked_by: list[str] = Field(default_factory=list, description="ids of jobs to wait for")
    routing: list[dict[str, Any]] = Field(
        default_factory=list,
        description="follow-on jobs on completion: {role, summary?, priority?, context?, "
        'constraints?, condition?}; a condition is e.g. {"path": "data.verdict", '
        '"equals": "approve"}',
        json_schema_extra=ROUTING,
    )
    idempotency_key: str | None = Field(
        None,
        description="the same key returns the first job",
        json_schema_extra={"minLength": 1, "maxLength": 200},
    )
