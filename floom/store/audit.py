"""The audit trail: one row per consequential action (a worker deleted, ...), kept after its
subject is gone, so who did what and when can always be read back."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index, Text
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class AuditEvent(SQLModel, table=True):
    """What happened (`type`, e.g. "worker.deleted"), to what (`subject`, e.g. "worker:hello"),
    by whom (the API key's id and label), and the details as JSON."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_subject", "subject", "id"),)
    id: str = Field(primary_key=True, max_length=40)
    type: str = Field(max_length=64, index=True)
    actor_key_id: str | None = Field(default=None, max_length=40)
    actor: str = Field(default="", max_length=160)
    subject: str = Field(max_length=200)
    payload_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
