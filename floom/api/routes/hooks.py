"""Inbound webhooks: /hooks/{worker} (signed per the worker's webhook trigger) and
/hooks/composio (Composio's events). No API key: the signature is the credential."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from floom.api.address_limit import HookFailureBudget, client_key
from floom.api.auth import CtxDep
from floom.api.openapi import errors
from floom.api.routing import JSONRoute
from floom.errors import TooManyWaits
from floom.schemas import triggers as trigger_models
from floom.services.access import principal
from floom.services.context import Context
from floom.services.runs import waits as run_waits
from floom.services.runs.rules import FINISHED
from floom.services.triggers import composio as composio_events
from floom.services.triggers import webhooks
from floom.store.models import Run
from floom.triggers.signatures import WebhookSignatureInvalid, WebhookStale, WebhookUnsigned
from floom.views import triggers as views
from floom.views.runs import run_public

router = APIRouter(tags=["hooks"], route_class=JSONRoute)

MAX_WAIT_SECONDS = 300.0
# What a delivery no webhook verifies is refused with: each spends the sender's budget.
SIGNATURE_FAILURES = (WebhookUnsigned, WebhookSignatureInvalid, WebhookStale)


T = TypeVar("T")


async def _receive(request: Request, hook: str, receive: Callable[[bytes], T]) -> T:
    """`receive(body)` in a thread; its failed signature checks are counted per address
    and per hook. The body was read within its bound by edge/bodies.py, which answered 429
    instead to a sender (or at a hook) whose failed checks were used up. A sender whose
    delivery was verified is let past the hook's budget for a while (a flood from
    elsewhere does not hold the hook's real sender back)."""
    budget: HookFailureBudget = request.app.state.hook_budget
    address = client_key(dict(request.scope))
    body = await request.body()
    try:
        received = await run_in_threadpool(receive, body)
    except SIGNATURE_FAILURES:  # a signature check failed, or no webhook is there
        budget.failed(hook=hook, address=address)
        raise
    budget.verified(hook=hook, address=address)
    return received


# A hook's body is the sender's own (any content type, up to FLOOM_WEBHOOK_MAX_BYTES); its
# signature headers are checked against the raw bytes.
HOOK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "description": "the event as the sender sends it; a JSON object becomes the run's "
        "inputs (or its `event` input)",
        "content": {
            "application/json": {"schema": {}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


def _refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A hook's error answers: the one error body, plus the delivery when it was recorded."""
    documented = errors(*statuses)
    for answer in documented.values():
        answer["model"] = trigger_models.HookRefusal
    return documented


@router.post(
    "/hooks/composio",
    summary="Receive a Composio trigger event",
    response_model=None,
    status_code=202,
    responses={
        200: {"model": trigger_models.ComposioAnswer, "description": "every event was seen before"},
        202: {"model": trigger_models.ComposioAnswer, "description": "the events were recorded"},
        **errors(400, 401, 408, 413, 422, 429, 503),
    },
    openapi_extra=HOOK_BODY,
)
async def composio_hook(request: Request, ctx: CtxDep) -> JSONResponse:
    headers = dict(request.headers)
    results = await _receive(
        request,
        "composio",
        lambda body: composio_events.receive_composio(ctx, headers=headers, body=body),
    )
    duplicate = all(r.duplicate for r in results)
    answer = trigger_models.ComposioAnswer(
        duplicate=duplicate, deliveries=[views.hook_answer(r) for r in results]
    )
    return JSONResponse(status_code=200 if duplicate else 202, content=answer.to_json())


@router.post(
    "/hooks/{worker}",
    summary="Receive a signed webhook for a worker",
    response_model=None,
    status_code=202,
    responses={
        200: {
            "model": trigger_models.HookAnswer,
            "description": "a duplicate delivery, or (with `wait`) the run ended in time",
        },
        202: {"model": trigger_models.HookAnswer, "description": "the delivery was recorded"},
        **_refusals(400, 401, 408, 409, 413, 422, 429, 503),
    },
    openapi_extra=HOOK_BODY,
)
async def worker_hook(
    worker: str,
    request: Request,
    ctx: CtxDep,
    wait: float = Query(
        0, ge=0, le=MAX_WAIT_SECONDS, description="wait up to this many seconds for the outputs"
    ),
    callback_url: str | None = Query(
        None,
        max_length=2048,
        description="POST the run's record here when it ends (signed with the server's "
        "callback key); its origin must be one the webhook's `callbacks` in worker.yml list "
        "(the query is not signed), checked once the delivery's signature is",
    ),
) -> JSONResponse:
    headers = dict(request.headers)
    received = await _receive(
        request,
        worker,
        lambda body: webhooks.receive_webhook(
            ctx, worker_name=worker, headers=headers, body=body, callback_url=callback_url
        ),
    )
    answer = views.hook_answer(received)
    if received.error is not None:
        refusal = views.hook_refusal(received.error, answer)
        return JSONResponse(status_code=received.error.status, content=refusal.to_json())
    if received.duplicate:
        return JSONResponse(status_code=200, content=answer.to_json())
    if answer.run_id and answer.status is None and wait > 0:
        ended = await _wait_for(ctx, answer.run_id, wait, worker=worker)
        if ended is not None:
            # A webhook's sender is a plain REST client.
            run = run_public(ended, surface="rest")
            waited = answer.model_copy(
                update={
                    "status": run.status,
                    "outputs": run.outputs,
                    "error": run.error,
                    "run": run,
                }
            )
            return JSONResponse(status_code=200, content=waited.to_json())
    return JSONResponse(status_code=202, content=answer.to_json())


async def _wait_for(ctx: Context, run_id: str, seconds: float, *, worker: str) -> Run | None:
    """The run if it ends within `seconds`. A hook's waits count against its own cap, as an
    API key's do; over the cap the sender is answered at once (202), as without ?wait, since
    its delivery is stored and its run started: a 429 would only make it send again."""
    try:
        run = await run_waits.wait_for_end(
            ctx, run_id=run_id, timeout=seconds, caller=principal.system(f"hook:{worker}")
        )
    except TooManyWaits:
        return None
    return run if run.status in FINISHED else None
