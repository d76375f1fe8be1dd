"""Tables of the handoff layer: agents, roles, jobs, their dependencies and audit events.

Events carry the job id without a foreign key on purpose: the audit trail outlives the job.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, Words, utcnow
from floom.vocabulary import JobPriority, JobStatus


class Role(SQLModel, table=True):
    """A kind of work agents take on ("reviewer"); renames keep the id, so jobs follow."""

    __tablename__ = "roles"
    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(unique=True, max_length=63)
    description: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    retired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Agent(SQLModel, table=True):
    """An identity that publishes and claims jobs; it authenticates with its own API keys."""

    __tablename__ = "agents"
    id: str = Field(primary_key=True, max_length=40)
    label: str = Field(unique=True, max_length=128)
    tool_family: str = Field(default="", max_length=40)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    retired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class AgentRole(SQLModel, table=True):
    __tablename__ = "agent_roles"
    agent_id: str = Field(primary_key=True, max_length=40)
    role_id: str = Field(primary_key=True, max_length=40, index=True)


class Job(SQLModel, table=True):
    """One handoff job. JSON columns hold the structured parts (context, artifacts, result)."""

    __tablename__ = "handoff_jobs"
    __table_args__ = (
        # claim_next: published jobs of a role by priority, then age.
        Index("ix_handoff_jobs_claim", "status", "target_role_id", "priority_rank", "id"),
        Index("ix_handoff_jobs_lease", "status", "lease_expires_at"),
        UniqueConstraint("idempotency_scope", "idempotency_key"),
    )
    id: str = Field(primary_key=True, max_length=40)
    summary: str = Field(sa_column=Column(Text, nullable=False))
    context_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    constraints_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    artifacts_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    routing_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    priority: JobPriority = Field(default=JobPriority.NORMAL, sa_type=Words(JobPriority, 8))
    priority_rank: int = 1
    target_role_id: str = Field(max_length=40)
    status: JobStatus = Field(sa_type=Words(JobStatus, 16))
    source_agent_id: str | None = Field(default=None, max_length=40, index=True)
    created_by_key: str | None = Field(default=None, max_length=40)
    assignee_agent_id: str | None = Field(default=None, max_length=40, index=True)
    idempotency_scope: str | None = Field(default=None, max_length=48)
    idempotency_key: str | None = Field(default=None, max_length=200)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    claimed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    result_json: str | None = Field(default=None, sa_column=Column(Text))
    reason: str | None = Field(default=None, sa_column=Column(Text))
    follow_on_of: str | None = Field(default=None, max_length=40, index=True)
    retry_of: str | None = Field(default=None, max_length=40, index=True)
    superseded_by: str | None = Field(default=None, max_length=40)
    attempt: int = 1
    rejection_reason: str | None = Field(default=None, sa_column=Column(Text))
    rejected_by: str | None = Field(default=None, max_length=40)
    # The run working on this job, when a worker's handoff trigger claimed it.
    run_id: str | None = Field(default=None, max_length=40, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class JobDependency(SQLModel, table=True):
    """`job_id` waits for `blocker_id` to complete."""

    __tablename__ = "handoff_dependencies"
    job_id: str = Field(primary_key=True, max_length=40)
    blocker_id: str = Field(primary_key=True, max_length=40, index=True)


class JobEvent(SQLModel, table=True):
    """One audit record: what changed on a job, who did it, and the status before and after."""

    __tablename__ = "handoff_events"
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(max_length=40, index=True)
    ts: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    type: str = Field(max_length=32)
    from_status: JobStatus | None = Field(default=None, sa_type=Words(JobStatus, 16))
    to_status: JobStatus | None = Field(default=None, sa_type=Words(JobStatus, 16))
    actor_agent_id: str | None = Field(default=None, max_length=40)
    actor_key_id: str | None = Field(default=None, max_length=40)
    actor: str = Field(default="", max_length=160)
    payload_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
