"""The audit trail: recording consequential actions in the caller's transaction, and reading
them back (admin only, through the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.services import paging
from floom.services.access.principal import Principal
from floom.store.audit import AuditEvent
from floom.store.db import session_scope
from floom.store.models import ApiKey, new_id

if TYPE_CHECKING:
    from floom.services.context import Context

WORKER_DELETED = "worker.deleted"


@dataclass(frozen=True)
class AuditActor:
    """Who acted: the API key's id (None for floom itself) and a label a person recognises."""

    key_id: str | None
    label: str

    @classmethod
    def of_key(cls, key: ApiKey) -> AuditActor:
        return cls(key_id=key.id, label=key.name or f"{key.prefix}...")

    @classmethod
    def of(cls, caller: Principal) -> AuditActor:
        return cls(key_id=caller.key_id, label=caller.describe())


SYSTEM = AuditActor(key_id=None, label="floom")


def new_event_id() -> str:
    """An event's id, for an action that names its record before writing it."""
    return new_id("aud")


def record(
    s: Session,
    *,
    type: str,
    actor: AuditActor,
    subject: str,
    payload: dict[str, Any],
    event_id: str | None = None,
) -> AuditEvent:
    """Add an event in the caller's transaction, so it exists exactly when the action does."""
    event = AuditEvent(
        id=event_id or new_event_id(),
        type=type,
        actor_key_id=actor.key_id,
        actor=actor.label[:160],
        subject=subject[:200],
        payload_json=jsonvalues.dumps(payload, where="payload"),
    )
    s.add(event)
    return event


def list_events(
    ctx: Context,
    *,
    type: str | None = None,
    subject: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    caller: Principal,
) -> tuple[list[AuditEvent], str | None]:
    """Newest first; `cursor` is the id of the last event of the previous page. The trail
    names keys and what they did, so reading it needs the admin scope."""
    caller.require("admin")
    paging.check_limit(limit)
    q = select(AuditEvent).order_by(col(AuditEvent.id).desc()).limit(limit + 1)
    if type:
        q = q.where(AuditEvent.type == type)
    if subject:
        q = q.where(AuditEvent.subject == subject)
    if cursor := paging.id_cursor(cursor, prefix="aud"):
        q = q.where(AuditEvent.id < cursor)
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(q).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor
