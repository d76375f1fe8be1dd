"""REST route for reading the audit trail (admin keys only)."""

from __future__ import annotations

from fastapi import APIRouter, Query

from floom.api.auth import AdminCaller, CtxDep
from floom.api.openapi import Limit, authed
from floom.api.routing import JSONRoute
from floom.schemas.audit import AuditEventPublic, audit_page
from floom.schemas.common import Page
from floom.services.access import audit

router = APIRouter(prefix="/api/v1", tags=["audit"], route_class=JSONRoute)


@router.get(
    "/audit",
    summary="Audit events, newest first",
    response_model=Page[AuditEventPublic],
    responses=authed(400, 422),
)
def list_audit_events(
    ctx: CtxDep,
    caller: AdminCaller,
    type: str | None = Query(None, max_length=64, description="e.g. worker.deleted"),
    subject: str | None = Query(None, max_length=200, description="e.g. worker:hello"),
    cursor: str | None = Query(None, max_length=40, description="next_cursor of a prior page"),
    limit: Limit = 50,
) -> Page[AuditEventPublic]:
    rows, next_cursor = audit.list_events(
        ctx, type=type, subject=subject, cursor=cursor, limit=limit, caller=caller
    )
    return audit_page(rows, next_cursor)
