"""REST routes for runs: start, list, inspect, logs (JSON and SSE), artifacts, cancel, replay."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep, ReadCaller, RunCaller, bearer_token
from floom.api.errors import floom_error_response
from floom.api.openapi import Cursor, Limit, WorkerName, authed, decimal, enum_query
from floom.api.routing import JSONRoute
from floom.errors import FloomError, TooManyWaits
from floom.schemas import runs as run_models
from floom.schemas.common import Page
from floom.services.access import keys
from floom.services.access.principal import Principal
from floom.services.alerts import callbacks
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs import logs
from floom.services.runs import rules as run_rules
from floom.services.runs import waits as run_waits
from floom.views import runs as views
from floom.vocabulary import RunTrigger

router = APIRouter(prefix="/api/v1", tags=["runs"], route_class=JSONRoute)

T = TypeVar("T")

SSE_POLL_SECONDS = 0.2
SSE_KEEPALIVE_SECONDS = 15.0
# While lines flow, the run's status is looked at no more often than this.
SSE_STATUS_SECONDS = 0.5
# How often an open stream asks again whether its caller may still read: a key revoked (or a
# web session ended) while a long run streams is cut off within this many seconds.
SSE_RECHECK_SECONDS = 1.0


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    latest: bool = Field(
        False,
        description="run on the worker's active version instead (without it, a replay of a run "
        "of another version needs a deploy-scoped key)",
    )
    force: bool = Field(
        False, description="run even though the worker is paused (a deploy-scoped key)"
    )


_CLIENT_TRIGGERS = {"cli": RunTrigger.MANUAL, "mcp": RunTrigger.MCP}


def surface_trigger(request: Request) -> RunTrigger:
    """The trigger a run started here records: `manual` from floom's CLI and `mcp` from its
    stdio MCP server (each says so in X-Floom-Client), `api` from any other client. No
    client can claim schedule, webhook or another trigger the server alone decides."""
    client = request.headers.get("x-floom-client", "").lower()
    return _CLIENT_TRIGGERS.get(client, RunTrigger.API)


@router.post(
    "/workers/{name}/runs",
    status_code=202,
    response_model=run_models.RunPublic,
    responses={
        200: {
            "model": run_models.RunDetail,
            "description": "with `wait`: the run ended (or settled) in time; the whole record",
        },
        **authed(400, 404, 409, 413, 422),
    },
)
async def start_run(
    name: WorkerName,
    body: run_models.RunRequest,
    request: Request,
    ctx: CtxDep,
    caller: RunCaller,
    wait: float = Query(
        0,
        ge=0,
        le=60,
        description="wait up to this many seconds for the run to end, and answer 200 with the "
        "whole run if it did (202 with the run as queued otherwise)",
    ),
    until: run_waits.Until = Query(
        "ended",
        description="with wait: `ended` waits for a final status; `settled` also answers "
        "when the run waits for a person (awaiting_approval)",
    ),
) -> Any:
    callback = None
    if body.callback_url is not None:  # its check resolves a host name: not on the loop
        callback = await run_in_threadpool(callbacks.check_callback_url, ctx, body.callback_url)
    create = functools.partial(
        runs.create_run,
        ctx,
        worker_name=name,
        inputs=body.inputs,
        coerce_strings=body.coerce_strings,
        trigger=surface_trigger(request),
        caller=caller,
        version_id=body.version_id,
        force=body.force,
        in_transaction=callbacks.recorder(callback),
    )
    if not wait:
        # One trip to a worker thread for both: each trip costs the event loop and the
        # thread a wake-up.
        return await run_in_threadpool(
            lambda: views.started_run(ctx, create(), surface=caller.surface)
        )
    run = await run_in_threadpool(create)
    # One round trip for a caller that wants the result: the same wait as GET ?wait=, under
    # the same per-key cap. Over the cap the run still stands, so the answer is the 202 a
    # caller without `wait` gets, never a refusal that would hide the run it created.
    waiting = run_waits.wait_and_read(
        ctx,
        run_id=run.id,
        timeout=wait,
        until=until,
        caller=caller,
        fresh=run,
        then=functools.partial(views.run_detail_of, ctx, caller=caller),
    )
    try:
        ended = await unless_caller_leaves(request, waiting)
    except TooManyWaits:
        return await run_in_threadpool(views.started_run, ctx, run, surface=caller.surface)
    detail = ended[1] if ended is not None else None
    if detail is None:  # the wait ran out (or the caller left): the run as it is now
        detail = await run_in_threadpool(views.run_detail, ctx, run_id=run.id, caller=caller)
    status = 200 if detail.status in run_waits.STOP_STATUSES[until] else 202
    return JSONResponse(status_code=status, content=detail.to_json())


@router.get("/runs", response_model=Page[run_models.RunPublic], responses=authed(400, 422))
def list_runs(
    ctx: CtxDep,
    caller: ReadCaller,
    worker: str | None = Query(None, description="only this worker's runs"),
    status: str | None = enum_query(run_rules.STATUSES, "only runs in this status"),
    trigger: str | None = enum_query(runs.TRIGGERS, "only runs started this way"),
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Page[run_models.RunPublic]:
    query = run_models.RunQuery(
        worker=worker, status=status, trigger=trigger, cursor=cursor, limit=limit
    )
    rows, next_cursor = runs.list_runs(ctx, **query.model_dump(), caller=caller)
    return views.run_page(rows, next_cursor, surface=caller.surface)


@router.get("/runs/{run_id}", response_model=run_models.RunDetail, responses=authed(404, 422, 429))
async def get_run(
    run_id: str,
    request: Request,
    ctx: CtxDep,
    caller: ReadCaller,
    wait: float = Query(
        0, ge=0, le=60, description="wait up to this many seconds for the run to end"
    ),
    until: run_waits.Until = Query(
        "ended",
        description="with wait: `ended` waits for a final status; `settled` also answers "
        "when the run waits for a person (awaiting_approval)",
    ),
) -> run_models.RunDetail:
    # Async so a waiter holds no thread: the API's thread pool stays free for other calls.
    if wait:
        waiting = run_waits.wait_and_read(
            ctx,
            run_id=run_id,
            timeout=wait,
            until=until,
            caller=caller,
            then=functools.partial(views.run_detail_of, ctx, caller=caller),
        )
        ended = await unless_caller_leaves(request, waiting)
        if ended is not None and ended[1] is not None:  # read with the run that ended the wait
            return ended[1]
    return await run_in_threadpool(views.run_detail, ctx, run_id=run_id, caller=caller)


async def unless_caller_leaves(request: Request, waiting: Coroutine[Any, Any, T]) -> T | None:
    """Await `waiting` and return what it returns, or cancel it (and return None) as soon as
    the client disconnects, so a dropped request gives its key's wait back at once instead
    of when ?wait runs out."""
    wait_task = asyncio.ensure_future(waiting)
    gone_task = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({wait_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone_task.cancel()
        if not wait_task.done():
            wait_task.cancel()
            await asyncio.gather(wait_task, return_exceptions=True)
    if wait_task.cancelled():
        return None
    return wait_task.result()  # the wait's own refusals (not_found, too_many_waits) stand


async def _disconnected(request: Request) -> None:
    # The body (none for a GET) has been read by now: the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.get("/runs/{run_id}/logs", response_model=run_models.LogPage, responses=authed(404, 422))
def get_logs(
    run_id: str,
    ctx: CtxDep,
    caller: ReadCaller,
    after: int = Query(0, ge=0, description="return events with a seq above this"),
    tail: int | None = Query(None, ge=1, le=10_000, description="only the last N events"),
    limit: int = Query(1000, ge=1, le=10_000),
) -> run_models.LogPage:
    return views.log_page(ctx, run_id=run_id, after=after, tail=tail, limit=limit, caller=caller)


@router.get(
    "/runs/{run_id}/logs/stream",
    summary="Server-sent events of a run's log",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`log` events (data: a run event, id: its seq), then one `end` "
            "event (data: the run) when the run has ended; resume with Last-Event-ID",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **authed(404, 422),
    },
)
async def stream_logs(
    run_id: str,
    request: Request,
    ctx: CtxDep,
    caller: ReadCaller,
    after: int = Query(0, ge=0),
    last_event_id: str | None = Header(None),
) -> StreamingResponse:
    await run_in_threadpool(functools.partial(runs.get_run, ctx, run_id=run_id, caller=caller))
    start = decimal(last_event_id, most=logs.MAX_SEQ)
    start = after if start is None else start
    still_valid = functools.partial(keys.authenticate, ctx, bearer_token(request))
    return log_event_stream(
        ctx, run_id, start=start, request=request, caller=caller, still_valid=still_valid
    )


def log_event_stream(
    ctx: Context,
    run_id: str,
    *,
    start: int,
    request: Request,
    caller: Principal,
    still_valid: Callable[[], object],
    statuses: bool = False,
) -> StreamingResponse:
    """Server-sent events of a run's log after seq `start`, ending with an `end` event when the
    run has ended; the REST API and the web UI (behind its own sign-in) both serve it. With
    `statuses` (the web UI's stream), a `status` event also tells each change of status.

    `still_valid` raises (Unauthorized) once the credential the stream was opened with no
    longer holds (a revoked key, an ended web session): asked every SSE_RECHECK_SECONDS, it
    ends the stream with an `error` event, so a stream opened before a revocation does not
    go on showing a run's log for as long as the run lasts."""

    surface = caller.surface
    # Counted before the first byte, so that a key over its cap is refused with a 429
    # instead of a stream; given back when the stream ends, however it ends.
    held = run_waits.hold_stream(ctx, holder=caller.key_id or caller.name)
    read_events = functools.partial(logs.list_events, ctx, run_id=run_id, caller=caller)
    read_run = functools.partial(runs.get_run, ctx, run_id=run_id, caller=caller)

    async def events() -> AsyncIterator[str]:
        # The run's end on this node wakes the stream at once (its last lines are stored by
        # then), so a follower hears the end without waiting out a poll.
        with held, ctx.node.run_ends.listening(run_id) as ended:
            async for chunk in stream(ended):
                yield chunk

    async def stream(ended: run_waits.Listener) -> AsyncIterator[str]:
        seq = start
        idle = 0.0
        status = ""
        status_seen_at = 0.0
        checked_at = time.monotonic()
        while not await request.is_disconnected():
            if time.monotonic() - checked_at >= SSE_RECHECK_SECONDS:
                try:
                    await run_in_threadpool(still_valid)
                except FloomError as exc:
                    refusal = bytes(floom_error_response(exc, surface=surface).body).decode()
                    yield f"event: error\ndata: {refusal}\n\n"
                    return
                checked_at = time.monotonic()
            rows = await run_in_threadpool(read_events, after=seq)
            for e in rows:
                seq = e.seq
                data = views.event_public(e, surface=surface).model_dump_json()
                yield f"id: {e.seq}\nevent: log\ndata: {data}\n\n"
            if rows and time.monotonic() - status_seen_at < SSE_STATUS_SECONDS:
                idle = 0.0
                continue
            run = await run_in_threadpool(read_run)
            status_seen_at = time.monotonic()
            if statuses and run.status != status:
                # A page shows the run's status from this event (a page opened while the run
                # was queued must say running once it starts, even if no notice is logged).
                status = run.status
                yield f"event: status\ndata: {json.dumps({'status': status})}\n\n"
            if rows:
                idle = 0.0
                continue
            if run.status in run_rules.FINISHED:
                # A last read closes the gap between the empty page and the status check.
                rest = await run_in_threadpool(read_events, after=seq)
                for e in rest:
                    seq = e.seq
                    data = views.event_public(e, surface=surface).model_dump_json()
                    yield f"id: {e.seq}\nevent: log\ndata: {data}\n\n"
                body = views.run_public(run, surface=surface).model_dump_json()
                yield f"event: end\ndata: {body}\n\n"
                return
            await ended.wait(SSE_POLL_SECONDS)
            ended.clear()
            idle += SSE_POLL_SECONDS
            if idle >= SSE_KEEPALIVE_SECONDS:
                idle = 0.0
                yield ": keep-alive\n\n"

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        # Also when the body never started (the client left first): release is idempotent.
        background=BackgroundTask(held.release),
    )


@router.get(
    "/runs/{run_id}/artifacts",
    response_model=Page[run_models.ArtifactPublic],
    responses=authed(404),
)
def list_artifacts(run_id: str, ctx: CtxDep, caller: ReadCaller) -> Page[run_models.ArtifactPublic]:
    return views.artifact_page(ctx, run_id=run_id, caller=caller)


@router.get(
    "/runs/{run_id}/artifacts/{name:path}",
    response_class=Response,
    responses={
        200: {
            "description": "the artifact's bytes, with its recorded content type",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        },
        **authed(404),
    },
)
def download_artifact(run_id: str, name: str, ctx: CtxDep, caller: ReadCaller) -> Response:
    art, data = runs.read_artifact(ctx, run_id=run_id, name=name, caller=caller)
    return Response(content=data, media_type=art.content_type, headers=artifact_headers(name))


def artifact_headers(name: str) -> dict[str, str]:
    """The headers of an artifact's bytes, on REST and in the web UI alike: a download, never
    sniffed, and, should a browser open it anyway (an HTML or SVG file a worker wrote), with
    no script and no access to floom's origin."""
    return {
        "Content-Disposition": download_disposition(name),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'; img-src 'self'",
        "Cache-Control": "private, no-store",
    }


def download_disposition(name: str) -> str:
    """The Content-Disposition of an artifact's download (REST and the web UI): its base name
    as RFC 6266 says it, whatever characters the worker gave it. The plain `filename` is its
    ASCII with quotes, backslashes and control characters dropped; `filename*` is the whole
    name, UTF-8 percent-encoded. A header holds latin-1 without control characters only: a
    name of CJK characters answered 500, one holding an escape sent no answer at all."""
    filename = name.rsplit("/", 1)[-1]
    ascii_name = filename.encode("ascii", "replace").decode()
    fallback = "".join(c for c in ascii_name if c.isprintable() and c not in '"\\') or "artifact"
    encoded = quote(filename, safe="", errors="replace")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"


@router.post(
    "/runs/{run_id}/cancel", response_model=run_models.RunDetail, responses=authed(404, 409)
)
def cancel_run(run_id: str, ctx: CtxDep, caller: RunCaller) -> run_models.RunDetail:
    runs.cancel_run(ctx, run_id=run_id, caller=caller)
    return views.run_detail(ctx, run_id=run_id, caller=caller)


@router.post(
    "/runs/{run_id}/replay",
    status_code=202,
    response_model=run_models.RunPublic,
    responses=authed(400, 404, 409, 422),
)
def replay_run(
    run_id: str, ctx: CtxDep, caller: RunCaller, body: ReplayRequest | None = None
) -> run_models.RunPublic:
    run = runs.replay_run(
        ctx,
        run_id=run_id,
        latest=bool(body and body.latest),
        caller=caller,
        force=bool(body and body.force),
    )
    return views.run_public(run, artifacts=[], surface=caller.surface)
