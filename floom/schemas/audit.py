"""Audit events (who changed what), as answered."""

from __future__ import annotations

from typing import Any

from floom.schemas.common import Page, Public, Timestamp
from floom.services.access import audit
from floom.store.audit import AuditEvent


class AuditActorPublic(Public):
    key_id: str | None
    label: str


class AuditEventPublic(Public):
    id: str
    type: str
    actor: AuditActorPublic
    subject: str
    payload: dict[str, Any]
    created_at: Timestamp


def audit_page(rows: list[AuditEvent], next_cursor: str | None) -> Page[AuditEventPublic]:
    items = [AuditEventPublic.model_validate(audit.event_to_dict(e)) for e in rows]
    return Page[AuditEventPublic](items=items, next_cursor=next_cursor)
