"""REST routes for triggers: list them with their next fire times, pause and resume, and the
stored webhook deliveries (list, show, replay)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from floom.api.auth import CtxDep, DeployCaller, ReadCaller, RunCaller
from floom.api.openapi import Cursor, Limit, WorkerName, authed
from floom.api.routing import JSONRoute
from floom.schemas import triggers as trigger_models
from floom.schemas.common import Page
from floom.schemas.runs import RunPublic
from floom.services.context import Context
from floom.services.triggers import registry as triggers
from floom.services.triggers import webhooks
from floom.views import triggers as views
from floom.views.runs import run_public

router = APIRouter(prefix="/api/v1", tags=["triggers"], route_class=JSONRoute)


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    trigger_id: str | None = Field(None, description="pause only this trigger of the worker")


class DeliveryReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    force: bool = Field(
        False, description="run even though the worker is paused (a deploy-scoped key)"
    )


def hook_urls(request: Request, ctx: Context) -> triggers.HookUrls:
    """Webhook URLs as senders reach them: FLOOM_PUBLIC_URL, else this request's base URL."""
    return triggers.HookUrls(ctx.settings.public_url or str(request.base_url))


@router.get(
    "/workers/{name}/triggers",
    summary="A worker's triggers and next fire times",
    response_model=trigger_models.TriggerListing,
    responses=authed(404),
)
def list_triggers(
    name: WorkerName, request: Request, ctx: CtxDep, caller: ReadCaller
) -> trigger_models.TriggerListing:
    return views.trigger_listing(ctx, name=name, urls=hook_urls(request, ctx), caller=caller)


@router.post(
    "/workers/{name}/pause",
    summary="Pause a worker, or one of its triggers",
    response_model=trigger_models.TriggerListing,
    responses=authed(400, 404, 422),
)
def pause(
    name: WorkerName,
    request: Request,
    ctx: CtxDep,
    caller: DeployCaller,
    body: PauseRequest | None = None,
) -> trigger_models.TriggerListing:
    trigger_id = body.trigger_id if body else None
    triggers.set_paused(ctx, worker_name=name, paused=True, trigger_id=trigger_id, caller=caller)
    return views.trigger_listing(ctx, name=name, urls=hook_urls(request, ctx), caller=caller)


@router.post(
    "/workers/{name}/resume",
    summary="Resume a worker, or one of its triggers",
    response_model=trigger_models.TriggerListing,
    responses=authed(400, 404, 422),
)
def resume(
    name: WorkerName,
    request: Request,
    ctx: CtxDep,
    caller: DeployCaller,
    body: PauseRequest | None = None,
) -> trigger_models.TriggerListing:
    trigger_id = body.trigger_id if body else None
    triggers.set_paused(ctx, worker_name=name, paused=False, trigger_id=trigger_id, caller=caller)
    return views.trigger_listing(ctx, name=name, urls=hook_urls(request, ctx), caller=caller)


@router.get(
    "/workers/{name}/deliveries",
    summary="A worker's webhook and Composio deliveries",
    response_model=Page[trigger_models.DeliveryPublic],
    responses=authed(400, 404, 422),
)
def list_deliveries(
    name: WorkerName, ctx: CtxDep, caller: ReadCaller, cursor: Cursor = None, limit: Limit = 50
) -> Page[trigger_models.DeliveryPublic]:
    rows, next_cursor = webhooks.list_deliveries(
        ctx, worker_name=name, cursor=cursor, limit=limit, caller=caller
    )
    items = [trigger_models.DeliveryPublic.of(d) for d in rows]
    return Page[trigger_models.DeliveryPublic](items=items, next_cursor=next_cursor)


@router.get(
    "/deliveries/{delivery_id}",
    summary="One delivery with its headers and body",
    response_model=trigger_models.DeliveryDetail,
    responses=authed(404),
)
def get_delivery(
    delivery_id: str, ctx: CtxDep, caller: ReadCaller
) -> trigger_models.DeliveryDetail:
    return views.delivery_detail(ctx, delivery_id=delivery_id, caller=caller)


@router.post(
    "/deliveries/{delivery_id}/replay",
    status_code=202,
    summary="Run a delivery again",
    response_model=RunPublic,
    responses=authed(400, 404, 409, 422),
)
def replay_delivery(
    delivery_id: str, ctx: CtxDep, caller: RunCaller, body: DeliveryReplayRequest | None = None
) -> RunPublic:
    run = webhooks.replay_delivery(
        ctx, delivery_id=delivery_id, caller=caller, force=bool(body and body.force)
    )
    return run_public(run, artifacts=[], surface=caller.surface)
