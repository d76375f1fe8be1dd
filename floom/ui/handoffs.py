"""The web UI's handoff board: jobs by status (filtered by role), one job with its lineage and
audit trail, and the moves the signed-in key may make, each made through the services."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.errors import FloomError, Forbidden
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.services.handoffs import board as handoff_board
from floom.services.handoffs import flow as handoff_flow
from floom.services.handoffs import review as handoff_review
from floom.ui.support import Me, UiRoute, checked_form, error_markup, render
from floom.views import handoffs as handoff_views

router = APIRouter(route_class=UiRoute, include_in_schema=False)

NOTICES = {
    "moved": "Done: the job moved, and the move is in its history below.",
    "rejected": "Rejected: this is the retry, published for the job's role with your reason.",
}


@router.get("/handoffs")
def board_page(request: Request, ctx: CtxDep, me: Me, role: str = "") -> Response:
    try:
        values = handoff_board.board(ctx, actor=me.caller, role=role or None)
        for column in values["columns"]:
            column["jobs"] = [handoff_views.stored_job(j) for j in column["jobs"]]
    except Forbidden as exc:
        # A key that speaks for no agent still sees the page, told how to take part.
        values = {"columns": [], "total": 0, "roles": [], "no_actor": error_markup(exc)}
    return render(request, "handoffs.html", {**values, "role": role})


def _job_page(
    request: Request,
    ctx: Context,
    me: SignedIn,
    job_id: str,
    extra: dict[str, Any] | None = None,
    status: int = 200,
) -> Response:
    values = handoff_board.job_view(ctx, actor=me.caller, job_id=job_id)
    values["job"] = handoff_views.stored_job(values["job"])
    return render(request, "handoff_job.html", {**values, **(extra or {})}, status)


@router.get("/handoffs/jobs/{job_id}")
def job_page(
    request: Request, job_id: str, ctx: CtxDep, me: Me, notice: str | None = None
) -> Response:
    return _job_page(request, ctx, me, job_id, {"notice": NOTICES.get(notice or "")})


@router.post("/handoffs/jobs/{job_id}/status")
async def move(request: Request, job_id: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    reason = str(form.get("reason") or "").strip() or None

    def action() -> str:
        handoff_flow.set_status(
            ctx, actor=me.caller, job_id=job_id, status=str(form.get("status") or ""), reason=reason
        )
        return job_id

    return await _act(request, ctx, me, job_id, action, "moved")


@router.post("/handoffs/jobs/{job_id}/reject")
async def reject(request: Request, job_id: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)

    def action() -> str:
        retry = handoff_review.reject(
            ctx, actor=me.caller, job_id=job_id, reason=str(form.get("reason") or "")
        )
        return retry.row.id

    return await _act(request, ctx, me, job_id, action, "rejected")


async def _act(
    request: Request, ctx: Context, me: SignedIn, job_id: str, action: Any, notice: str
) -> Response:
    """Run a move; show the job again with the refusal (and nothing changed) if it fails."""
    try:
        target = await run_in_threadpool(action)
    except FloomError as exc:
        extra = {"action_error": error_markup(exc), "allowed": _allowed(exc)}
        return await run_in_threadpool(_job_page, request, ctx, me, job_id, extra, exc.status)
    return RedirectResponse(
        f"/handoffs/jobs/{quote(target, safe='')}?notice={notice}", status_code=303
    )


def _allowed(exc: FloomError) -> list[str] | None:
    details = exc.details if isinstance(exc.details, dict) else {}
    allowed = details.get("allowed")
    return [str(a) for a in allowed] if isinstance(allowed, list) else None
