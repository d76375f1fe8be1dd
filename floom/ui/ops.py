"""The web UI's operator actions on a worker: pause and resume it, or one of its triggers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.services.triggers import registry as triggers
from floom.ui.support import Me, UiRoute, checked_form

router = APIRouter(route_class=UiRoute, include_in_schema=False)


async def _set_paused(
    request: Request, name: str, ctx: CtxDep, me: Me, *, paused: bool
) -> Response:
    form = await checked_form(request, me)
    trigger_id = str(form.get("trigger_id") or "") or None
    await run_in_threadpool(
        triggers.set_paused,
        ctx,
        worker_name=name,
        paused=paused,
        trigger_id=trigger_id,
        caller=me.caller,
    )
    notice = "paused" if paused else "resumed"
    return RedirectResponse(f"/workers/{name}?notice={notice}#triggers", status_code=303)


@router.post("/workers/{name}/pause")
async def pause(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    return await _set_paused(request, name, ctx, me, paused=True)


@router.post("/workers/{name}/resume")
async def resume(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    return await _set_paused(request, name, ctx, me, paused=False)
