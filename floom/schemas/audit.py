"""Audit events (who changed what), as answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from floom import jsonvalues
from floom.schemas.common import Page, Public, Timestamp

if TYPE_CHECKING:
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

    @classmethod
    def of(cls, event: AuditEvent) -> Self:
        return cls(
            id=event.id,
            type=event.type,
            actor=AuditActorPublic(key_id=event.actor_key_id, label=event.actor),
            subject=event.subject,
            payload=jsonvalues.stored(event.payload_json, expect=dict),
            created_at=event.created_at,
        )


def audit_page(rows: list[AuditEvent], next_cursor: str | None) -> Page[AuditEventPublic]:
    items = [AuditEventPublic.of(e) for e in rows]
    return Page[AuditEventPublic](items=items, next_cursor=next_cursor)
