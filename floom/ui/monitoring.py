"""The web UI's monitoring pages: the cluster's nodes (and which of them went silent), and
alerts: channels with a "send a test alert" action, rules, deliveries with a re-send."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.api.openapi import decimal
from floom.errors import FloomError
from floom.schemas import alerts as alert_views
from floom.schemas.nodes import node_public
from floom.services.access.sessions import SignedIn
from floom.services.alerts import channels, deliveries, rules
from floom.services.context import Context
from floom.services.ops import nodes
from floom.ui.support import Me, UiRoute, checked_form, error_markup, render

router = APIRouter(route_class=UiRoute, include_in_schema=False)

NOTICES = {
    "channel-added": "Channel added. Send it a test alert to see that it works.",
    "channel-deleted": "Channel deleted.",
    "rule-added": "Rule added.",
    "rule-deleted": "Rule deleted.",
    "rule-enabled": "Rule enabled.",
    "rule-disabled": "Rule disabled: it routes nothing until enabled again.",
    "resent": "Queued to be sent again.",
}
CHANNEL_FIELDS = ("url", "secret", "url_secret", "host", "username", "password_secret", "sender")


@router.get("/nodes")
def nodes_page(request: Request, ctx: CtxDep, me: Me) -> Response:
    items = [node_public(v) for v in nodes.list_nodes(ctx, caller=me.caller)]
    return render(request, "nodes.html", {"items": items})


def _alerts_page(
    request: Request, ctx: Context, me: SignedIn, extra: dict[str, Any], status: int = 200
) -> Response:
    rows, _ = deliveries.list_deliveries(ctx, limit=50, caller=me.caller)
    values = {
        "channels": [
            alert_views.channel_public(c, full=channels.sees_whole_urls(me.caller))
            for c in channels.list_channels(ctx, caller=me.caller)
        ],
        "rules": [alert_views.rule_public(r) for r in rules.list_rules(ctx, caller=me.caller)],
        "deliveries": [
            alert_views.delivery_public(d, full=channels.sees_whole_urls(me.caller)) for d in rows
        ],
        "form": {},
        **extra,
    }
    return render(request, "alerts.html", values, status)


@router.get("/alerts")
def alerts_page(request: Request, ctx: CtxDep, me: Me, notice: str | None = None) -> Response:
    return _alerts_page(request, ctx, me, {"notice": NOTICES.get(notice or "")})


def _channel_config(form: Any) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key in CHANNEL_FIELDS:
        value = str(form.get(key) or "").strip()
        if value:
            config[key] = value
    port = str(form.get("port") or "").strip()
    if port:
        number = decimal(port, most=65535)
        config["port"] = port if number is None else number
    to = [a.strip() for a in str(form.get("to") or "").split(",") if a.strip()]
    if to:
        config["to"] = to
    if form.get("no_starttls"):
        config["starttls"] = False
    return config


async def _act(
    request: Request, ctx: Context, me: SignedIn, action: Any, notice: str, where: str
) -> Response:
    try:
        await run_in_threadpool(action)
    except FloomError as exc:
        form = dict(await request.form())
        form.pop("csrf", None)
        extra = {where: error_markup(exc), "form": form}
        return await run_in_threadpool(_alerts_page, request, ctx, me, extra, exc.status)
    return RedirectResponse(f"/alerts?notice={notice}", status_code=303)


@router.post("/alerts/channels")
async def add_channel(request: Request, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)

    def add() -> None:
        channels.create_channel(
            ctx,
            name=str(form.get("name") or "").strip(),
            kind=str(form.get("kind") or ""),
            config=_channel_config(form),
            caller=me.caller,
        )

    return await _act(request, ctx, me, add, "channel-added", "channel_error")


@router.post("/alerts/channels/{name}/test")
async def test_channel(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    try:
        sent = await run_in_threadpool(
            deliveries.send_test, ctx, channel_name=name, caller=me.caller
        )
    except FloomError as exc:
        extra = {"test_error": error_markup(exc)}
        return await run_in_threadpool(_alerts_page, request, ctx, me, extra, exc.status)
    notice = f"Test alert delivered to {name} ({sent.id})."
    return await run_in_threadpool(_alerts_page, request, ctx, me, {"notice": notice})


@router.post("/alerts/channels/{name}/delete")
async def delete_channel(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    return await _act(
        request,
        ctx,
        me,
        lambda: channels.delete_channel(ctx, name=name, caller=me.caller),
        "channel-deleted",
        "test_error",
    )


@router.post("/alerts/rules")
async def add_rule(request: Request, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)

    def words(key: str) -> list[str]:
        return [w.strip() for w in str(form.get(key) or "").split(",") if w.strip()]

    def add() -> None:
        rules.create_rule(
            ctx,
            name=str(form.get("name") or "").strip(),
            events=words("events"),
            channels=words("channels"),
            worker=str(form.get("worker") or "").strip() or None,
            recovery=not form.get("no_recovery"),
            caller=me.caller,
        )

    return await _act(request, ctx, me, add, "rule-added", "rule_error")


@router.post("/alerts/rules/{name}/delete")
async def delete_rule(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    return await _act(
        request,
        ctx,
        me,
        lambda: rules.delete_rule(ctx, name=name, caller=me.caller),
        "rule-deleted",
        "rule_error",
    )


@router.post("/alerts/rules/{name}/{action}")
async def switch_rule(request: Request, name: str, action: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    if action not in ("enable", "disable"):
        return Response(status_code=404)
    enabled = action == "enable"
    return await _act(
        request,
        ctx,
        me,
        lambda: rules.set_enabled(ctx, name=name, enabled=enabled, caller=me.caller),
        f"rule-{action}d",
        "rule_error",
    )


@router.post("/alerts/deliveries/{delivery_id}/resend")
async def resend(request: Request, delivery_id: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    return await _act(
        request,
        ctx,
        me,
        lambda: deliveries.resend(ctx, delivery_id=delivery_id, caller=me.caller),
        "resent",
        "delivery_error",
    )
