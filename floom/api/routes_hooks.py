"""Inbound webhooks: /hooks/{worker} (signed per the worker's webhook trigger) and
/hooks/composio (Composio's events). No API key: the signature is the credential."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.services import composio_events, runs, webhooks
from floom.services.context import Context

router = APIRouter(tags=["hooks"])

MAX_WAIT_SECONDS = 300.0
WAIT_POLL_SECONDS = 0.1


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
        run = await _wait_for(ctx, run_id, wait)
        if run is not None:
            content.update(
                status=run["status"], outputs=run["outputs"], error=run["error"], run=run
            )
            return JSONResponse(status_code=200, content=_jsonable(content))
    return JSONResponse(status_code=202, content=content)


async def _wait_for(ctx: Context, run_id: str, seconds: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + seconds
    while True:
        run = await run_in_threadpool(runs.get_run, ctx, run_id=run_id)
        if run.status in runs.TERMINAL:
            return runs.run_to_dict(run)
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(min(WAIT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def _jsonable(value: Any) -> Any:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(value)
