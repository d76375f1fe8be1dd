"""The web UI's run pages: the filtered run list, one run (live log, outputs, artifacts,
lineage, actions), the browser's log stream and artifact previews."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.api.openapi import decimal
from floom.api.routes.runs import artifact_headers, log_event_stream
from floom.errors import FloomError, InvalidRequest, NotFound
from floom.schemas import runs as run_models
from floom.schemas import workers as worker_models
from floom.services.access import keys
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs import lineage, logs
from floom.services.runs import rules as run_rules
from floom.services.workers import versions as workers
from floom.store.models import utcnow
from floom.ui import features as ui_features
from floom.ui.support import (
    Me,
    UiRoute,
    checked_form,
    error_markup,
    render,
    session_still_valid,
)
from floom.views import runs as run_views
from floom.views import workers as worker_views

router = APIRouter(route_class=UiRoute, include_in_schema=False)

PAGE_SIZE = 50
LOG_TAIL = 2000
PREVIEW_BYTES = 512 * 1024
CSV_ROWS = 200
SINCE = {
    "1h": ("the last hour", timedelta(hours=1)),
    "24h": ("the last 24 hours", timedelta(hours=24)),
    "7d": ("the last 7 days", timedelta(days=7)),
    "30d": ("the last 30 days", timedelta(days=30)),
}
# Binary image types: named in the preview so the page says why there is none.
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
NOTICES = {
    "rolled-back": "Rolled back: this run's version is the worker's active version now.",
    "cancel-requested": "Cancel requested; a running run stops within seconds.",
    "approved": "Approved; the run continues.",
    "rejected": "Rejected; the run was told why.",
}


@router.get("/runs")
def runs_page(
    request: Request,
    ctx: CtxDep,
    me: Me,
    worker: str = "",
    status: str = "",
    trigger: str = "",
    since: str = "",
    after: str = "",
    before: str = "",
    cursor: str | None = None,
    limit: int = Query(PAGE_SIZE, ge=1, le=200),
) -> Response:
    window = SINCE.get(since)
    created_after = time_bound(after, name="from")
    if window and (created_after is None or utcnow() - window[1] > created_after):
        created_after = utcnow() - window[1]
    rows, next_cursor = runs.list_runs(
        ctx,
        caller=me.caller,
        worker=worker or None,
        status=status or None,
        trigger=trigger or None,
        cursor=cursor,
        limit=limit,
        created_after=created_after,
        created_before=time_bound(before, name="to"),
    )
    names = [w.name for w in workers.list_workers(ctx, limit=500, caller=me.caller)[0]]
    filters = {
        "worker": worker,
        "status": status,
        "trigger": trigger,
        "since": since,
        "after": after,
        "before": before,
    }
    # The page size rides along in the links but is no filter of its own.
    kept = {**filters, "limit": str(limit) if limit != PAGE_SIZE else ""}
    return render(
        request,
        "runs.html",
        {
            "items": run_views.run_page(rows, next_cursor, surface=me.caller.surface).items,
            "next_cursor": next_cursor,
            "cursor": cursor,
            "filters": filters,
            "query": urlencode({k: v for k, v in kept.items() if v}),
            "filtered": any(filters.values()),
            "worker_names": names,
            "statuses": run_rules.STATUSES,
            "triggers": runs.TRIGGERS,
            "since_options": [(k, label) for k, (label, _) in SINCE.items()],
        },
    )


def time_bound(value: str, *, name: str) -> datetime | None:
    """A time of the runs filter: ISO 8601 (a browser's datetime-local field sends
    2026-12-03T14:05), in UTC unless it names its offset."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise InvalidRequest(
            f"'{value[:40]}' is not a time for '{name}'",
            hint="write it like 2026-12-03T14:05 (UTC) or 2026-12-03T14:05+01:00",
        ) from exc
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def _run_context(ctx: Context, me: SignedIn, run_id: str) -> dict[str, Any]:
    caller = me.caller
    run = run_views.run_detail(ctx, run_id=run_id, caller=caller)
    try:
        worker: worker_models.WorkerPublic | None = worker_views.worker_public(
            ctx, name=run.worker, caller=caller
        )
    except NotFound:
        worker = None  # deleted with its runs kept: they stay readable
    rows = logs.tail_events(ctx, run_id=run_id, count=LOG_TAIL, caller=caller)
    events = [run_views.event_public(e, surface=caller.surface) for e in rows]
    children = lineage.child_runs(ctx, run_id=run_id, caller=caller)
    calls = agent_runs.list_tool_calls(ctx, run_id=run_id, caller=caller)
    started_by = keys.key_names(ctx, key_ids=[run.created_by or ""], caller=caller)
    return {
        "run": run,
        "worker": worker,
        "inputs": run.inputs,
        "outputs": run.outputs,
        "artifacts": run.artifacts,
        "events": events,
        "last_seq": events[-1].seq if events else 0,
        "log_truncated": bool(events) and events[0].seq > 1,
        "terminal": run.status in run_rules.FINISHED,
        "children": [run_views.run_public(c, surface=caller.surface) for c in children],
        "is_active_version": worker is not None and worker.active_version_id == run.version_id,
        "approvals": [ui_features.approval_view(a) for a in run.approvals],
        # Every recorded call, whatever the run's kind (the run record lists an agent's only).
        "tool_calls": [run_models.ToolCallPublic.of(c) for c in calls],
        "model_usage": run.model_usage,
        "started_by": started_by.get(run.created_by or ""),
    }


def run_page_with(
    request: Request,
    ctx: Context,
    me: SignedIn,
    run_id: str,
    extra: dict[str, Any],
    status: int = 200,
) -> Response:
    """The run page with something extra in it, such as the error of an action on it."""
    return render(request, "run.html", {**_run_context(ctx, me, run_id), **extra}, status)


@router.get("/runs/{run_id}")
def run_page(
    request: Request, run_id: str, ctx: CtxDep, me: Me, notice: str | None = None
) -> Response:
    values = _run_context(ctx, me, run_id)
    values["notice"] = NOTICES.get(notice or "")
    return render(request, "run.html", values)


async def _act(
    request: Request, run_id: str, ctx: Context, me: SignedIn, action: Callable[[], Response]
) -> Response:
    """Run an action of the run page; on a floom error show the page again with it."""
    try:
        return await run_in_threadpool(action)
    except FloomError as exc:
        extra = {"action_error": error_markup(exc)}
        return await run_in_threadpool(run_page_with, request, ctx, me, run_id, extra, exc.status)


@router.post("/runs/{run_id}/replay")
async def replay(request: Request, run_id: str, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)

    def action() -> Response:
        latest = form.get("latest") == "1"
        new = runs.replay_run(ctx, run_id=run_id, latest=latest, caller=me.caller)
        return RedirectResponse(f"/runs/{new.id}", status_code=303)

    return await _act(request, run_id, ctx, me, action)


@router.post("/runs/{run_id}/cancel")
async def cancel(request: Request, run_id: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)

    def action() -> Response:
        runs.cancel_run(ctx, run_id=run_id, caller=me.caller)
        return RedirectResponse(f"/runs/{run_id}?notice=cancel-requested", status_code=303)

    return await _act(request, run_id, ctx, me, action)


@router.post("/runs/{run_id}/rollback")
async def rollback_to_run(request: Request, run_id: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)

    def action() -> Response:
        run = runs.get_run(ctx, run_id=run_id, caller=me.caller)
        workers.rollback(ctx, name=run.worker_name, run_id=run_id, caller=me.caller)
        return RedirectResponse(f"/runs/{run_id}?notice=rolled-back", status_code=303)

    return await _act(request, run_id, ctx, me, action)


@router.get("/runs/{run_id}/logs/stream")
async def log_stream(
    request: Request,
    run_id: str,
    ctx: CtxDep,
    me: Me,
    after: int = Query(0, ge=0),
    last_event_id: str | None = Header(None),
) -> Response:
    """The REST API's log stream behind the browser session (EventSource cannot send a
    bearer header); resumes after the last seq the page or the reconnecting browser saw."""
    await run_in_threadpool(runs.get_run, ctx, run_id=run_id, caller=me.caller)
    start = decimal(last_event_id, most=logs.MAX_SEQ)
    start = after if start is None else start
    return log_event_stream(
        ctx,
        run_id,
        start=start,
        request=request,
        caller=me.caller,
        still_valid=session_still_valid(request),
        statuses=True,
    )


def _preview(content_type: str, name: str, data: bytes) -> dict[str, Any]:
    """How to show an artifact: a CSV table, pretty JSON, text, or nothing.

    Binary artifacts (images included) are never shown inline, only downloaded: their bytes
    had secrets masked in each encoding, but what they show is the viewer's to decode."""
    lower = name.lower()
    if content_type in INLINE_IMAGES:
        return {"kind": "none", "reason": "binary files are not previewed"}
    if len(data) > PREVIEW_BYTES or b"\0" in data[:4096]:
        return {"kind": "none", "reason": "too large or not text"}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"kind": "none", "reason": "not UTF-8 text"}
    if content_type == "text/csv" or lower.endswith(".csv"):
        rows = list(csv.reader(io.StringIO(text)))
        return {
            "kind": "csv",
            "header": rows[0] if rows else [],
            "rows": rows[1 : CSV_ROWS + 1],
            "more": max(len(rows) - 1 - CSV_ROWS, 0),
        }
    if content_type == "application/json" or lower.endswith(".json"):
        try:
            return {"kind": "json", "text": json.dumps(json.loads(text), indent=2)}
        except (ValueError, RecursionError):  # not JSON, or past a parser limit: as text
            pass
    return {"kind": "text", "text": text}


@router.get("/runs/{run_id}/artifacts/{name:path}")
def artifact_page(request: Request, run_id: str, name: str, ctx: CtxDep, me: Me) -> Response:
    art, data = runs.read_artifact(ctx, run_id=run_id, name=name, caller=me.caller)
    return render(
        request,
        "artifact.html",
        {
            "run_id": run_id,
            "artifact": run_models.ArtifactPublic.of(art),
            "preview": _preview(art.content_type, name, data),
        },
    )


@router.get("/runs/{run_id}/files/{name:path}")
def artifact_file(run_id: str, name: str, ctx: CtxDep, me: Me) -> Response:
    art, data = runs.read_artifact(ctx, run_id=run_id, name=name, caller=me.caller)
    # Binary artifacts are never shown inline (see _preview).
    return Response(content=data, media_type=art.content_type, headers=artifact_headers(name))
