"""Inbound webhooks: /hooks/{worker} (signed per the worker's webhook trigger) and
/hooks/composio (Composio's events). No API key: the signature is the credential."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.errors import TooManyWaits
from floom.services import composio_events, run_waits, runs, webhooks
from floom.services.context import Context
from floom.services.run_rules import FINISHED
from floom.store.models import Run

router = APIRouter(tags=["hooks"])

MAX_WAIT_SECONDS = 300.0


async def _read_body(request: Request, ctx: Context) -> bytes:
    limit = ctx.settings.webhook_max_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise webhooks.payload_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise webhooks.payload_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(received: webhooks.Received) -> dict[str, Any]:
    d = received.delivery
    return {
        "delivery_id": d.id,
        "worker": d.worker_name or None,
        "outcome": d.outcome,
        "run_id": d.run_id if d.outcome == webhooks.RUN else None,
        "duplicate": received.duplicate,
        "message": d.message,
    }


@router.post("/hooks/composio", summary="Receive a Composio trigger event")
async def composio_hook(request: Request, ctx: CtxDep) -> JSONResponse:
    body = await _read_body(request, ctx)
    results = await run_in_threadpool(
        composio_events.receive_composio, ctx, headers=dict(request.headers), body=body
    )
    duplicate = all(r.duplicate for r in results)
    content = {
        "duplicate": duplicate,
        "deliveries": [_answer(r) for r in results],
    }
    return JSONResponse(status_code=200 if duplicate else 202, content=content)


@router.post("/hooks/{worker}", summary="Receive a signed webhook for a worker")
async def worker_hook(
    worker: str,
    request: Request,
    ctx: CtxDep,
    wait: float = Query(
        0, ge=0, le=MAX_WAIT_SECONDS, description="wait up to this many seconds for the outputs"
    ),
) -> JSONResponse:
    body = await _read_body(request, ctx)
    received = await run_in_threadpool(
        webhooks.receive_webhook, ctx, worker_name=worker, headers=dict(request.headers), body=body
    )
    content = _answer(received)
    if received.error is not None:
        content = {"error": received.error.to_dict(), "delivery": content}
        return JSONResponse(status_code=received.error.status, content=content)
    if received.duplicate:
        return JSONResponse(status_code=200, content=content)
    run_id = content["run_id"]
    if run_id and wait > 0:
        ended = await _wait_for(ctx, run_id, wait, worker=worker)
        if ended is not None:
            run = runs.run_to_dict(ended)
            content.update(
                status=run["status"], outputs=run["outputs"], error=run["error"], run=run
            )
            return JSONResponse(status_code=200, content=_jsonable(content))
    return JSONResponse(status_code=202, content=content)


async def _wait_for(ctx: Context, run_id: str, seconds: float, *, worker: str) -> Run | None:
    """The run if it ends within `seconds`. A hook's waits count against its own cap, as an
    API key's do; over the cap the sender is answered at once (202), as without ?wait, since
    its delivery is stored and its run started: a 429 would only make it send again."""
    try:
        run = await run_waits.wait_for_end(
            ctx, run_id=run_id, timeout=seconds, waiter=f"hook:{worker}"
        )
    except TooManyWaits:
        return None
    return run if run.status in FINISHED else None


def _jsonable(value: Any) -> Any:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(value)
