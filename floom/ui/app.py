"""The web UI, served at /: server-rendered pages over floom's services. This module wires the
pages in and serves the workers pages; runs, approvals and admin pages have their own."""

from __future__ import annotations

import functools
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from floom import jsonvalues
from floom.api.auth import CtxDep
from floom.api.openapi import decimal
from floom.api.routing import add_routes
from floom.errors import FloomError, InputInvalid, InvalidRequest, StateInvalid
from floom.manifest.schema import Manifest
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs import lineage
from floom.services.runs import stats as run_stats
from floom.services.workers import deletion as worker_deletion
from floom.services.workers import exposure
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.ui import admin as ui_admin
from floom.ui import approvals as ui_approvals
from floom.ui import features as ui_features
from floom.ui import handoffs as ui_handoffs
from floom.ui import monitoring as ui_monitoring
from floom.ui import ops as ui_ops
from floom.ui import replays as ui_replays
from floom.ui import runs as ui_runs
from floom.ui.chart import history_chart
from floom.ui.forms import inputs_from_text, problems_by_input, run_form, submitted_text
from floom.ui.support import (
    WEB_DIR,
    Me,
    UiRoute,
    checked_form,
    error_markup,
    render,
    told,
)
from floom.views import runs as run_views
from floom.views import workers as worker_views
from floom.vocabulary import RunTrigger

router = APIRouter(route_class=UiRoute, include_in_schema=False)
log = logging.getLogger("floom.ui")

NOTICES = {
    "rolled-back": "Rolled back: the chosen version is active now; new runs use it.",
    "deleted": "Deleted: the worker's triggers are stopped; its runs stay listed unless purged.",
    "purged": "Deleted: the worker and its runs, logs and artifacts are gone.",
    "paused": "Paused: schedule ticks and webhook deliveries are recorded as skipped, not run.",
    "resumed": "Resumed: new ticks and deliveries run again (skipped ones are not run).",
    "state-set": "State set: the worker's next run starts from this version.",
}
# State versions the worker's page lists (the rest with `floom state history`).
STATE_VERSIONS_SHOWN = 10


def install(app: FastAPI) -> None:
    """Serve the UI at / and its static files at /static."""
    if not (WEB_DIR / "templates").is_dir() or not (WEB_DIR / "static").is_dir():
        # An install without the source tree's web/ folder still serves the API.
        log.warning("web UI not served: %s has no templates/ and static/", WEB_DIR)
        return
    add_routes(app, ui_admin.router)
    add_routes(app, ui_runs.router)
    add_routes(app, ui_approvals.router)
    add_routes(app, ui_handoffs.router)
    add_routes(app, ui_monitoring.router)
    add_routes(app, ui_replays.router)
    add_routes(app, ui_ops.router)
    add_routes(app, router)
    app.mount("/static", StaticFiles(directory=WEB_DIR / "static"), name="static")


@router.get("/")
def workers_page(
    request: Request, ctx: CtxDep, me: Me, cursor: str | None = None, notice: str | None = None
) -> Response:
    caller = me.caller
    page = worker_views.worker_page(ctx, cursor=cursor, limit=50, caller=caller)
    last = lineage.last_runs(ctx, worker_names=[w.name for w in page.items], caller=caller)
    surface = caller.surface
    items = [
        {
            "worker": w,
            "last_run": run_views.run_public(last[w.name], surface=surface)
            if w.name in last
            else None,
            "triggers": ui_features.trigger_summaries(w.triggers),
        }
        for w in page.items
    ]
    return render(
        request,
        "workers.html",
        {
            "items": items,
            "next_cursor": page.next_cursor,
            "cursor": cursor,
            "notice": NOTICES.get(notice or ""),
        },
    )


def _worker_context(ctx: Context, me: SignedIn, name: str, base_url: str) -> dict[str, Any]:
    caller = me.caller
    worker = worker_views.worker_detail(ctx, name=name, caller=caller)
    versions = worker_views.version_page(ctx, name=name, caller=caller).items
    listed = next((v for v in versions if v.active), None)
    readable = worker.manifest and jsonvalues.UNREADABLE not in worker.manifest
    manifest = Manifest.model_validate(worker.manifest) if readable else None
    # The Manifest box shows worker.yml as written, which only the version's detail carries.
    active = (
        worker_views.version_detail(ctx, name=name, version_id=listed.id, caller=caller)
        if listed is not None
        else None
    )
    files = [(f.path, f.size) for f in active.files] if active is not None else []
    return {
        "worker": worker,
        "versions": versions,
        "active": active,
        "manifest": manifest,
        "files": sorted(files),
        "fields": run_form(manifest) if manifest else [],
        "exposed_to": exposure.allowed_surfaces(manifest) if manifest else (),
        "recent": worker.recent_runs,
        "triggers": ui_features.worker_triggers(
            ctx, worker_name=name, base_url=base_url, caller=caller
        ),
        "deliveries": ui_features.webhook_deliveries(ctx, worker_name=name, caller=caller),
        "history": history_chart(run_stats.daily_history(ctx, worker_name=name, caller=caller)),
        "state": worker_views.worker_state_public(ctx, name=name, caller=caller),
        "state_versions": worker_views.state_version_page(
            ctx, name=name, limit=STATE_VERSIONS_SHOWN, caller=caller
        ).items,
    }


@router.get("/workers/{name}")
def worker_page(
    request: Request, name: str, ctx: CtxDep, me: Me, notice: str | None = None
) -> Response:
    values = _worker_context(ctx, me, name, str(request.base_url))
    values["notice"] = NOTICES.get(notice or "")
    return render(request, "worker.html", values)


@router.post("/workers/{name}/runs")
async def start_run(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    values = await run_in_threadpool(_worker_context, ctx, me, name, str(request.base_url))
    manifest = values["manifest"]
    text = submitted_text(manifest, form) if manifest else {}
    try:
        run = await run_in_threadpool(
            runs.create_run,
            ctx,
            worker_name=name,
            inputs=inputs_from_text(text),
            coerce_strings=True,
            trigger=RunTrigger.MANUAL,
            caller=me.caller,
        )
    except FloomError as exc:
        details = exc.details_for(told) if isinstance(exc, InputInvalid) else None
        problems = problems_by_input(details)
        if manifest:
            values["fields"] = run_form(manifest, text, problems)
        values["run_error"] = error_markup(exc)
        return await run_in_threadpool(render, request, "worker.html", values, exc.status)
    return RedirectResponse(f"/runs/{run.id}", status_code=303)


@router.post("/workers/{name}/rollback")
async def rollback(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    version_id = str(form.get("version_id") or "")
    state_version = str(form.get("state_version") or "").strip()
    try:
        if state_version:
            number = decimal(state_version, most=worker_state.MAX_VERSION)
            if number is None:
                raise InvalidRequest(
                    f"state_version: {state_version[:40]!r} is not a state version number",
                    hint="pick one of the kept versions listed under State",
                )
            await run_in_threadpool(
                functools.partial(
                    worker_state.rollback_with_state,
                    ctx,
                    name=name,
                    version_id=version_id,
                    state_version=number,
                    caller=me.caller,
                )
            )
        else:
            await run_in_threadpool(
                workers.rollback, ctx, name=name, version_id=version_id, caller=me.caller
            )
    except FloomError as exc:
        values = await run_in_threadpool(_worker_context, ctx, me, name, str(request.base_url))
        values["versions_error"] = error_markup(exc)
        return await run_in_threadpool(render, request, "worker.html", values, exc.status)
    return RedirectResponse(f"/workers/{name}?notice=rolled-back#versions", status_code=303)


@router.post("/workers/{name}/state")
async def set_state(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    text = str(form.get("state") or "")
    restore = str(form.get("from_version") or "")
    try:
        # Refused before the text is parsed (up to the request's size), as the REST route
        # refuses before reading its body; set_state decides again.
        me.caller.require("deploy")
        if restore:
            number = decimal(restore, most=worker_state.MAX_VERSION)
            if number is None:
                raise InvalidRequest(
                    f"{restore[:40]!r} is not a state version", hint="pick one listed"
                )
            await run_in_threadpool(
                worker_state.set_state,
                ctx,
                worker_name=name,
                from_version=number,
                caller=me.caller,
            )
        else:
            value, breach = jsonvalues.parse(text, where="state")
            if breach is not None:
                raise StateInvalid(breach.message, hint='write JSON, e.g. {"since": "2026-01-01"}')
            await run_in_threadpool(
                worker_state.set_state, ctx, worker_name=name, state=value, caller=me.caller
            )
    except FloomError as exc:
        values = await run_in_threadpool(_worker_context, ctx, me, name, str(request.base_url))
        values["state_error"] = error_markup(exc)
        values["state_text"] = text
        return await run_in_threadpool(render, request, "worker.html", values, exc.status)
    return RedirectResponse(f"/workers/{name}?notice=state-set#state", status_code=303)


@router.post("/workers/{name}/delete")
async def delete(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    purge = form.get("purge_runs") == "on"
    try:
        await run_in_threadpool(
            worker_deletion.delete_worker,
            ctx,
            name=name,
            purge_runs=purge,
            caller=me.caller,
            confirm_name=str(form.get("confirm_name") or ""),
        )
    except FloomError as exc:
        values = await run_in_threadpool(_worker_context, ctx, me, name, str(request.base_url))
        values["delete_error"] = error_markup(exc)
        return await run_in_threadpool(render, request, "worker.html", values, exc.status)
    return RedirectResponse(f"/?notice={'purged' if purge else 'deleted'}", status_code=303)


@router.get("/workers/{name}/diff")
def diff_page(
    request: Request,
    name: str,
    ctx: CtxDep,
    me: Me,
    old: str | None = None,
    new: str | None = None,
) -> Response:
    worker = worker_views.worker_public(ctx, name=name, caller=me.caller)
    versions = worker_views.version_page(ctx, name=name, caller=me.caller).items
    # Newest first: by default compare the active version with the one deployed before it.
    new = new or worker.active_version_id or (versions[0].id if versions else None)
    ids = [v.id for v in versions]
    if old is None and new in ids and ids.index(new) + 1 < len(ids):
        old = ids[ids.index(new) + 1]
    result = None
    if old and new:
        result = worker_views.version_diff(ctx, name=name, old_id=old, new_id=new, caller=me.caller)
    return render(
        request,
        "diff.html",
        {"worker": worker, "versions": versions, "old": old, "new": new, "diff": result},
    )
