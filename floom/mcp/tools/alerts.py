"""floom's alert tools over MCP: channels (with a test send), global rules and deliveries;
written against the Backend interface."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations
from pydantic import Field

from floom.mcp.render import Reply, said
from floom.mcp.toolkit import READ, WRITE, FloomTool, backend_of, floom_tool, off
from floom.schemas.alerts import (
    AlertDeliveryPublic,
    ChannelChange,
    ChannelPublic,
    DeliveryQuery,
    RuleCreate,
)
from floom.schemas.common import OneOf
from floom.vocabulary import ChannelKind, DeliveryPurpose, DeliveryStatus


def _channels_text(items: list[ChannelPublic]) -> str:
    if not items:
        return "no alert channel yet: add one with add_alert_channel"
    return "\n".join(
        f"{c.name} ({c.kind}): " + ", ".join(f"{k}={v}" for k, v in c.config.items()) for c in items
    )


def _delivery_line(d: AlertDeliveryPublic) -> str:
    to = d.channel or d.target or ""
    why = f" ({said(d.last_error)})" if d.last_error else ""
    return f"{d.id} {d.status} {d.type} to {to}, {d.attempts} tries: {said(d.summary)}{why}"


@floom_tool
async def list_alert_channels(ctx: Context) -> Reply:
    """Alert channels (webhook, Slack, email): their settings name secrets, never values."""
    listing = await off(backend_of(ctx).alert_channels)
    return Reply(_channels_text(listing.items), listing.to_json())


@floom_tool
async def add_alert_channel(
    ctx: Context,
    name: Annotated[str, Field(description="a lowercase slug, e.g. ops")],
    kind: Annotated[
        Annotated[ChannelKind, OneOf(ChannelKind, strict=True)],
        Field(description="the channel kind"),
    ],
    config: Annotated[
        dict[str, Any],
        Field(
            description="webhook: {url, secret}; slack: {url_secret}; email: {host, port, "
            "starttls, username, password_secret, sender, to}. secret, url_secret and "
            "password_secret are NAMES of secrets set with set_secret, never values"
        ),
    ],
) -> Reply:
    """Add an alert channel; every setting is checked now (a bad one changes nothing)."""
    channel = await off(backend_of(ctx).add_alert_channel, name, kind, config)
    text = f"added {kind} channel {name}; try it with test_alert_channel"
    return Reply(text, channel.to_json())


@floom_tool
async def update_alert_channel(
    ctx: Context,
    name: Annotated[str, Field(description="the channel")],
    config: Annotated[
        dict[str, Any],
        Field(
            description="the settings to change; the others stay (null removes one, a list "
            "is replaced whole; list_alert_channels shows them): webhook: {url, secret}; "
            "slack: {url_secret}; email: {host, port, starttls, username, password_secret, "
            "sender, to}. Secrets by NAME, never values"
        ),
    ],
) -> Reply:
    """Change some of an alert channel's settings; checked as when added (a bad one changes
    nothing)."""
    change = ChannelChange(config=config)
    channel = await off(backend_of(ctx).update_alert_channel, name, change)
    return Reply(f"updated {channel.kind} channel {name}", channel.to_json())


@floom_tool
async def test_alert_channel(
    ctx: Context, name: Annotated[str, Field(description="the channel")]
) -> Reply:
    """Send a test alert to a channel now; an error says why it did not arrive."""
    delivery = await off(backend_of(ctx).test_alert_channel, name)
    return Reply(f"test alert delivered to {name} ({delivery.id})", delivery.to_json())


@floom_tool
async def list_alert_rules(ctx: Context) -> Reply:
    """The global alert rules (a worker's own live in its worker.yml, `alerts:`)."""
    listing = await off(backend_of(ctx).alert_rules)
    lines = [
        f"{r.name}: {', '.join(r.events)} of {r.worker or 'every worker'} -> "
        f"{', '.join(r.channels)}" + ("" if r.enabled else " (disabled)")
        for r in listing.items
    ]
    return Reply("\n".join(lines) or "no global alert rule", listing.to_json())


@floom_tool
async def add_alert_rule(
    ctx: Context,
    name: Annotated[str, Field(description="a lowercase slug, e.g. failures")],
    events: Annotated[
        list[str],
        Field(description="run.failed, run.timed_out, schedule.missed, node.lost, run.*, * ..."),
    ],
    channels: Annotated[list[str], Field(description="channel names")],
    worker: Annotated[str | None, Field(description="only this worker's events")] = None,
    recovery: Annotated[bool, Field(description="send the recovery too")] = True,
) -> Reply:
    """Add a global alert rule: which events go to which channels."""
    rule = RuleCreate(name=name, events=events, channels=channels, worker=worker, recovery=recovery)
    added = await off(backend_of(ctx).add_alert_rule, rule)
    return Reply(f"added rule {name}", added.to_json())


@floom_tool
async def set_alert_rule_enabled(
    ctx: Context,
    name: Annotated[str, Field(description="the global rule")],
    enabled: Annotated[bool, Field(description="false: it routes nothing until turned on")],
) -> Reply:
    """Turn a global alert rule on or off (it is kept either way)."""
    rule = await off(backend_of(ctx).set_alert_rule_enabled, name, enabled)
    return Reply(f"rule {name} {'enabled' if rule.enabled else 'disabled'}", rule.to_json())


@floom_tool
async def list_alert_deliveries(
    ctx: Context,
    status: Annotated[
        Annotated[DeliveryStatus, OneOf(DeliveryStatus, strict=True)] | None,
        Field(description="only deliveries in this status"),
    ] = None,
    purpose: Annotated[
        Annotated[DeliveryPurpose, OneOf(DeliveryPurpose, strict=True)] | None,
        Field(description="only this kind"),
    ] = None,
    run_id: Annotated[str | None, Field(description="only this run's")] = None,
    channel: Annotated[str | None, Field(description="only this channel's")] = None,
    cursor: Annotated[str | None, Field(description="next_cursor of a previous page")] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 20,
) -> Reply:
    """Alert, test and run-callback deliveries, newest first, with status and last error, a
    page at a time (next_cursor continues)."""
    query = DeliveryQuery(
        status=status, purpose=purpose, run_id=run_id, channel=channel, cursor=cursor, limit=limit
    )
    page = await off(backend_of(ctx).alert_deliveries, query)
    text = "\n".join(_delivery_line(d) for d in page.items) or "no deliveries"
    if page.next_cursor:
        text += f"\nmore: list_alert_deliveries(cursor={page.next_cursor!r})"
    return Reply(text, page.to_json())


@floom_tool
async def resend_alert_delivery(
    ctx: Context, delivery_id: Annotated[str, Field(description="the delivery, dlv_...")]
) -> Reply:
    """Send a failed or throttled delivery again (a delivered one as a new delivery)."""
    delivery = await off(backend_of(ctx).resend_alert_delivery, delivery_id)
    return Reply(f"{delivery.id} queued to send again", delivery.to_json())


# A test send reaches outside floom.
SENDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)

ALERT_TOOLS: tuple[FloomTool, ...] = (
    FloomTool(list_alert_channels, READ, "read"),
    FloomTool(add_alert_channel, WRITE, "deploy"),
    FloomTool(update_alert_channel, WRITE, "deploy"),
    FloomTool(test_alert_channel, SENDS, "deploy"),
    FloomTool(list_alert_rules, READ, "read"),
    FloomTool(add_alert_rule, WRITE, "deploy"),
    FloomTool(set_alert_rule_enabled, WRITE, "deploy"),
    FloomTool(list_alert_deliveries, READ, "read"),
    FloomTool(resend_alert_delivery, SENDS, "deploy"),
)
