"""REST routes for alerts: channels (with a test send), rules, deliveries (listed, re-sent) and
the key that signs run callbacks."""

from __future__ import annotations

from fastapi import APIRouter, Query

from floom.api.auth import AdminCaller, CtxDep, DeployCaller, ReadCaller
from floom.api.openapi import Cursor, Limit, authed, enum_query
from floom.api.routing import JSONRoute
from floom.schemas import alerts as views
from floom.schemas.common import Page
from floom.services.alerts import channels, deliveries, rules
from floom.services.alerts.senders import callback_key

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"], route_class=JSONRoute)


@router.get("/channels", response_model=views.ChannelList, responses=authed())
def list_channels(ctx: CtxDep, caller: ReadCaller) -> views.ChannelList:
    rows = channels.list_channels(ctx, caller=caller)
    full = channels.sees_whole_urls(caller)
    return views.ChannelList(items=[views.channel_public(r, full=full) for r in rows])


@router.post(
    "/channels",
    status_code=201,
    response_model=views.ChannelPublic,
    responses=authed(400, 409, 422),
    summary="Add a channel; its credentials are named secrets, checked now",
)
def create_channel(
    body: views.ChannelCreate, ctx: CtxDep, caller: DeployCaller
) -> views.ChannelPublic:
    row = channels.create_channel(
        ctx, name=body.name, kind=body.kind, config=body.config, caller=caller
    )
    return views.channel_public(row)


@router.put("/channels/{name}", response_model=views.ChannelPublic, responses=authed(400, 404, 422))
def update_channel(
    name: str, body: views.ChannelUpdate, ctx: CtxDep, caller: DeployCaller
) -> views.ChannelPublic:
    return views.channel_public(
        channels.update_channel(ctx, name=name, config=body.config, caller=caller)
    )


@router.patch(
    "/channels/{name}",
    response_model=views.ChannelPublic,
    responses=authed(400, 404, 409, 422),
    summary="Change some of a channel's settings (the others stay); checked as when added",
)
def change_channel(
    name: str, body: views.ChannelChange, ctx: CtxDep, caller: DeployCaller
) -> views.ChannelPublic:
    return views.channel_public(
        channels.change_channel(ctx, name=name, changes=body.config, caller=caller)
    )


@router.delete("/channels/{name}", response_model=views.Deleted, responses=authed(404))
def delete_channel(name: str, ctx: CtxDep, caller: DeployCaller) -> views.Deleted:
    channels.delete_channel(ctx, name=name, caller=caller)
    return views.Deleted(name=name, deleted=True)


@router.post(
    "/channels/{name}/test",
    response_model=views.AlertDeliveryPublic,
    responses=authed(404, 502),
    summary="Send a test alert now; 502 alert_undeliverable says why it did not arrive",
)
def test_channel(name: str, ctx: CtxDep, caller: DeployCaller) -> views.AlertDeliveryPublic:
    return views.delivery_public(deliveries.send_test(ctx, channel_name=name, caller=caller))


@router.get("/rules", response_model=views.RuleList, responses=authed())
def list_rules(ctx: CtxDep, caller: ReadCaller) -> views.RuleList:
    return views.RuleList(
        items=[views.rule_public(r) for r in rules.list_rules(ctx, caller=caller)]
    )


@router.post(
    "/rules", status_code=201, response_model=views.RulePublic, responses=authed(400, 404, 409, 422)
)
def create_rule(body: views.RuleCreate, ctx: CtxDep, caller: DeployCaller) -> views.RulePublic:
    row = rules.create_rule(ctx, **body.model_dump(), caller=caller)
    return views.rule_public(row)


@router.patch(
    "/rules/{name}",
    response_model=views.RulePublic,
    responses=authed(400, 404, 422),
    summary="Turn a global rule on or off",
)
def update_rule(
    name: str, body: views.RuleUpdate, ctx: CtxDep, caller: DeployCaller
) -> views.RulePublic:
    return views.rule_public(rules.set_enabled(ctx, name=name, enabled=body.enabled, caller=caller))


@router.delete("/rules/{name}", response_model=views.Deleted, responses=authed(404))
def delete_rule(name: str, ctx: CtxDep, caller: DeployCaller) -> views.Deleted:
    rules.delete_rule(ctx, name=name, caller=caller)
    return views.Deleted(name=name, deleted=True)


@router.get(
    "/deliveries", response_model=Page[views.AlertDeliveryPublic], responses=authed(400, 422)
)
def list_deliveries(
    ctx: CtxDep,
    caller: ReadCaller,
    status: str | None = enum_query(deliveries.STATUSES, "only deliveries in this status"),
    purpose: str | None = enum_query(deliveries.PURPOSES, "only alerts, tests or callbacks"),
    channel: str | None = Query(None, max_length=63, description="only this channel's"),
    run_id: str | None = Query(None, max_length=40, description="only this run's"),
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Page[views.AlertDeliveryPublic]:
    query = views.DeliveryQuery(
        status=status, purpose=purpose, channel=channel, run_id=run_id, cursor=cursor, limit=limit
    )
    rows, next_cursor = deliveries.list_deliveries(ctx, **query.model_dump(), caller=caller)
    return views.delivery_page(rows, next_cursor, full=channels.sees_whole_urls(caller))


@router.get(
    "/deliveries/{alert_delivery_id}",
    response_model=views.AlertDeliveryPublic,
    responses=authed(404),
)
def get_delivery(
    alert_delivery_id: str, ctx: CtxDep, caller: ReadCaller
) -> views.AlertDeliveryPublic:
    return views.delivery_public(
        deliveries.get_delivery(ctx, delivery_id=alert_delivery_id, caller=caller),
        full=channels.sees_whole_urls(caller),
    )


@router.post(
    "/deliveries/{alert_delivery_id}/resend",
    status_code=202,
    response_model=views.AlertDeliveryPublic,
    responses=authed(404, 409),
    summary="Send a delivery again (a delivered one as a new delivery)",
)
def resend_delivery(
    alert_delivery_id: str, ctx: CtxDep, caller: DeployCaller
) -> views.AlertDeliveryPublic:
    return views.delivery_public(
        deliveries.resend(ctx, delivery_id=alert_delivery_id, caller=caller)
    )


@router.get(
    "/callback-key",
    response_model=views.CallbackKey,
    responses=authed(),
    summary="The key that signs run callbacks (admin): verify them with Standard Webhooks",
)
def get_callback_key(ctx: CtxDep, caller: AdminCaller) -> views.CallbackKey:
    caller.require("admin")
    return views.CallbackKey(key=callback_key(ctx))
