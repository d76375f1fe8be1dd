"""REST routes for triggers: list them with their next fire times, pause and resume, and the
stored webhook deliveries (list, show, replay)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from floom.api.auth import CtxDep, DeployKey, ReadKey, RunKey
from floom.services import runs, triggers, webhooks
from floom.services.context import Context

router = APIRouter(prefix="/api/v1", tags=["triggers"])


class PauseRequest(BaseModel):
    trigger_id: str | None = Field(None, description="pause only this trigger of the worker")


class DeliveryReplayRequest(BaseModel):
    force: bool = Field(False, description="run even though the worker is paused")


def hook_urls(request: Request, ctx: Context) -> triggers.HookUrls:
    """Webhook URLs as senders reach them: FLOOM_PUBLIC_URL, else this request's base URL."""
    return triggers.HookUrls(ctx.settings.public_url or str(request.base_url))


def _listing(request: Request, ctx: Context, name: str) -> dict[str, Any]:
    worker, rows = triggers.list_triggers(ctx, worker_name=name)
    urls = hook_urls(request, ctx)
    return {
        "worker": name,
        "paused": worker.paused,
        "items": [triggers.trigger_to_dict(ctx, t, worker=worker, urls=urls) for t in rows],
        "next_cursor": None,
    }


@router.get("/workers/{name}/triggers", summary="A worker's triggers and next fire times")
def list_triggers(name: str, request: Request, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    return _listing(request, ctx, name)


@router.post("/workers/{name}/pause", summary="Pause a worker, or one of its triggers")
def pause(
    name: str, request: Request, ctx: CtxDep, _: DeployKey, body: PauseRequest | None = None
) -> dict[str, Any]:
    triggers.set_paused(
        ctx, worker_name=name, paused=True, trigger_id=body.trigger_id if body else None
    )
    return _listing(request, ctx, name)


@router.post("/workers/{name}/resume", summary="Resume a worker, or one of its triggers")
def resume(
    name: str, request: Request, ctx: CtxDep, _: DeployKey, body: PauseRequest | None = None
) -> dict[str, Any]:
    triggers.set_paused(
        ctx, worker_name=name, paused=False, trigger_id=body.trigger_id if body else None
    )
    return _listing(request, ctx, name)


@router.get("/workers/{name}/deliveries", summary="A worker's webhook and Composio deliveries")
def list_deliveries(
    name: str,
    ctx: CtxDep,
    _: ReadKey,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    rows, next_cursor = webhooks.list_deliveries(ctx, worker_name=name, cursor=cursor, limit=limit)
    return {"items": [webhooks.delivery_to_dict(d) for d in rows], "next_cursor": next_cursor}


@router.get("/deliveries/{delivery_id}", summary="One delivery with its headers and body")
def get_delivery(delivery_id: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    delivery = webhooks.get_delivery(ctx, delivery_id=delivery_id)
    return webhooks.delivery_to_dict(delivery, with_body=True)


@router.post("/deliveries/{delivery_id}/replay", status_code=202, summary="Run a delivery again")
def replay_delivery(
    delivery_id: str, ctx: CtxDep, key: RunKey, body: DeliveryReplayRequest | None = None
) -> dict[str, Any]:
    run = webhooks.replay_delivery(
        ctx, delivery_id=delivery_id, actor=key.id, force=bool(body and body.force)
    )
    return runs.run_to_dict(run, artifacts=[])
