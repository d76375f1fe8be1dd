"""Tables of agent runs and approvals: approvals, tool calls, transcripts, worker memory."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, Words, utcnow
from floom.vocabulary import ApprovalKind, ApprovalStatus, ToolCallStatus


class Approval(SQLModel, table=True):
    """A pause a person decides: a gated tool call ("tool_call") or a run's outputs ("run")."""

    __tablename__ = "approvals"
    __table_args__ = (
        Index("ix_approvals_status", "status", "id"),
        # The alert watch's probe counts decisions since its anchor (floom/services/alerts).
        Index("ix_approvals_decided", "decided_at"),
    )
    id: str = Field(primary_key=True, max_length=40)
    run_id: str = Field(index=True, max_length=40)
    worker_name: str = Field(max_length=63)
    kind: ApprovalKind = Field(sa_type=Words(ApprovalKind, 16))
    tool: str | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=40)
    status: ApprovalStatus = Field(
        default=ApprovalStatus.PENDING, sa_type=Words(ApprovalStatus, 16)
    )
    proposed_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    edited_json: str | None = Field(default=None, sa_column=Column(Text))
    comment: str | None = Field(default=None, sa_column=Column(Text))
    decided_by: str | None = Field(default=None, max_length=80)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    decided_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class ToolCall(SQLModel, table=True):
    """One tool call of an agent run, with secret values already redacted."""

    __tablename__ = "tool_calls"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)
    id: str = Field(primary_key=True, max_length=40)
    run_id: str = Field(max_length=40)
    seq: int
    attempt: int = 1
    tool: str = Field(max_length=128)
    status: ToolCallStatus = Field(sa_type=Words(ToolCallStatus, 24))
    arguments_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    result: str | None = Field(default=None, sa_column=Column(Text))
    result_size: int = 0
    error: str | None = Field(default=None, sa_column=Column(Text))
    duration_ms: int = 0
    approval_id: str | None = Field(default=None, max_length=40)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Transcript(SQLModel, table=True):
    """An agent run's conversation with the model: also the state a paused run resumes from."""

    __tablename__ = "agent_transcripts"
    __table_args__ = (Index("ix_transcripts_worker_month", "worker_name", "created_at"),)
    run_id: str = Field(primary_key=True, max_length=40)
    worker_name: str = Field(max_length=63)
    model: str = Field(max_length=128)
    system: str = Field(default="", sa_column=Column(Text, nullable=False))
    messages_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    state_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    iterations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    active_seconds: float = 0.0
    workspace_digest: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # The run ended and its system prompt, messages and state, and its tool calls, moved into
    # its log's blob in object storage (floom/store/blobs/logs.py): the row keeps the rest
    # (usage, cost, workspace), its text columns are empty, its tool_calls rows gone.
    archived: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})


class MemoryEntry(SQLModel, table=True):
    """One write to a worker's memory; the newest write of a key is its value."""

    __tablename__ = "agent_memory"
    __table_args__ = (Index("ix_agent_memory_key", "worker_name", "key", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    worker_name: str = Field(max_length=63)
    key: str = Field(max_length=200)
    value_json: str = Field(sa_column=Column(Text, nullable=False))
    run_id: str = Field(max_length=40)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
