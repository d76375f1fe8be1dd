"""REST route for reading the audit trail (admin keys only)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from floom.api.auth import AdminKey, CtxDep
from floom.services import audit

router = APIRouter(prefix="/api/v1", tags=["audit"])


@router.get("/audit", summary="Audit events, newest first")
def list_audit_events(
    ctx: CtxDep,
    _: AdminKey,
    type: str | None = Query(None, max_length=64, description="e.g. worker.deleted"),
    subject: str | None = Query(None, max_length=200, description="e.g. worker:hello"),
    cursor: str | None = Query(None, max_length=40, description="next_cursor of a prior page"),
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    rows, next_cursor = audit.list_events(
        ctx, type=type, subject=subject, cursor=cursor, limit=limit
    )
    return {"items": [audit.event_to_dict(e) for e in rows], "next_cursor": next_cursor}
