"""The web UI's replay and eval pages: a replay's report against its original, an eval's
per-run table, and the forms that start them (exact or what-if from a run, an eval of a
worker)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from floom.api.auth import CtxDep
from floom.schemas import replays as replay_views
from floom.services.replays import evals
from floom.services.replays import replay as replays
from floom.ui.support import Me, UiRoute, checked_form, render

router = APIRouter(route_class=UiRoute, include_in_schema=False)


@router.get("/replays/{run_id}")
def replay_page(request: Request, run_id: str, ctx: CtxDep, me: Me) -> Response:
    report = replay_views.replay_report(replays.replay_report(ctx, run_id=run_id, caller=me.caller))
    return render(request, "replay.html", {"r": report})


@router.post("/runs/{run_id}/replays")
async def start_replay(request: Request, run_id: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    mode = str(form.get("mode") or "exact")
    version = str(form.get("version_id") or "") or None
    run = replays.start_replay(ctx, run_id=run_id, mode=mode, version_id=version, caller=me.caller)
    return RedirectResponse(f"/replays/{run.id}", status_code=303)


@router.get("/evals/{eval_id}")
def eval_page(request: Request, eval_id: str, ctx: CtxDep, me: Me) -> Response:
    report = replay_views.eval_report(evals.eval_report(ctx, eval_id=eval_id, caller=me.caller))
    return render(request, "eval.html", {"e": report})


@router.post("/workers/{name}/evals")
async def start_eval(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    row = evals.start_eval(
        ctx,
        worker_name=name,
        selector=str(form.get("runs") or "last:20"),
        version_id=str(form.get("version_id") or "") or None,
        caller=me.caller,
    )
    return RedirectResponse(f"/evals/{row.id}", status_code=303)
