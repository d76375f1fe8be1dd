"""The web UI's approvals: the inbox of everything waiting for a person, and the decisions
(approve, approve with edits, reject) posted from it or from a run's page."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from floom import jsonvalues
from floom.api.auth import CtxDep
from floom.errors import FloomError, InvalidRequest
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.ui import features as ui_features
from floom.ui.runs import run_page_with
from floom.ui.support import Me, UiRoute, checked_form, error_markup, render, safe_next
from floom.vocabulary import Decision

router = APIRouter(route_class=UiRoute, include_in_schema=False)

NOTICES = {
    "approved": "Approved; the run continues.",
    "rejected": "Rejected; the run was told why.",
}


def _inbox(
    request: Request,
    ctx: Context,
    me: SignedIn,
    extra: dict[str, Any] | None = None,
    status: int = 200,
) -> Response:
    items = ui_features.pending_approvals(ctx, caller=me.caller)
    return render(request, "approvals.html", {"items": items, **(extra or {})}, status)


@router.get("/approvals")
def approvals_page(request: Request, ctx: CtxDep, me: Me, notice: str | None = None) -> Response:
    return _inbox(request, ctx, me, {"notice": NOTICES.get(notice or "")})


def _edits(ctx: Context, me: SignedIn, approval_id: str, form: FormData) -> dict[str, Any] | None:
    """The values a person changed in the edit box: only keys whose value differs from the
    proposal count as edits, so "approve with edits" without a change is a plain approval."""
    text = form.get("edited")
    if not isinstance(text, str) or not text.strip():
        return None
    edited, breach = jsonvalues.parse(text, where="the edited values")
    if breach is not None:
        raise InvalidRequest(
            breach.message,
            hint='write a JSON object such as {"title": "a better title"}; '
            + jsonvalues.bounds_hint(),
            details=[breach.detail()],
        )
    if not isinstance(edited, dict):
        raise InvalidRequest(
            "the edited values must be a JSON object of names to values",
            hint='e.g. {"title": "a better title"}',
        )
    proposed = ui_features.proposed_of(ctx, approval_id=approval_id, caller=me.caller)
    changed = {k: v for k, v in edited.items() if k not in proposed or proposed[k] != v}
    return changed or None


async def _decide(
    request: Request, ctx: Context, me: SignedIn, approval_id: str, decision: Decision
) -> Response:
    form = await checked_form(request, me)
    back = safe_next(str(form.get("back") or "/approvals"))
    comment = str(form.get("comment") or "")

    def action() -> None:
        edited = _edits(ctx, me, approval_id, form) if decision == Decision.APPROVE else None
        ui_features.decide(
            ctx,
            approval_id=approval_id,
            decision=decision,
            edited=edited,
            comment=comment,
            caller=me.caller,
        )

    try:
        await run_in_threadpool(action)
    except FloomError as exc:
        extra = {"decide_error": error_markup(exc), "decide_error_id": approval_id}
        if back.startswith("/runs/"):
            run_id = back.removeprefix("/runs/").split("?")[0].split("#")[0]
            return await run_in_threadpool(
                run_page_with, request, ctx, me, run_id, extra, exc.status
            )
        return await run_in_threadpool(_inbox, request, ctx, me, extra, exc.status)
    verdict = "approved" if decision == Decision.APPROVE else "rejected"
    joiner = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{joiner}notice={verdict}", status_code=303)


@router.post("/approvals/{approval_id}/approve")
async def approve(request: Request, approval_id: str, ctx: CtxDep, me: Me) -> Response:
    return await _decide(request, ctx, me, approval_id, Decision.APPROVE)


@router.post("/approvals/{approval_id}/reject")
async def reject(request: Request, approval_id: str, ctx: CtxDep, me: Me) -> Response:
    return await _decide(request, ctx, me, approval_id, Decision.REJECT)
