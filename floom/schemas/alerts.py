"""Alert channels, rules and deliveries as the REST API, the MCP tools and the CLI show them:
a channel's settings name its secrets, never their values; a callback's URL is shown
without its query (which may carry a token)."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from floom import jsonvalues
from floom.schemas.common import (
    ChannelKindWord,
    DeliveryPurposeWord,
    DeliveryStatusWord,
    OneOf,
    Page,
    Public,
    Timestamp,
)
from floom.vocabulary import ChannelKind, DeliveryStatus

if TYPE_CHECKING:
    from floom.store.models import AlertChannel, AlertRule, Delivery


class ChannelCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    name: str = Field(description="a lowercase slug, e.g. ops-email")
    kind: Annotated[ChannelKind, OneOf(ChannelKind, strict=True)]
    config: dict[str, Any] = Field(
        description="webhook: url, secret (the NAME of the secret holding its whsec_ signing "
        "key); slack: url_secret (the NAME of the secret holding the incoming webhook URL); "
        "email: host, port, starttls, username, password_secret, sender, to"
    )


class ChannelUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    config: dict[str, Any]


class ChannelChange(BaseModel):
    """Some of a channel's settings, to merge over the others: the one shape of PATCH
    /api/v1/alerts/channels/{name}'s body, the client's change_alert_channel, both MCP
    backends and the update_alert_channel tool, and `floom alerts channels update`."""

    # A field other than config (a kind, say: a channel's kind does not change) is refused,
    # not ignored as if it had been applied.
    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(
        description="the settings to change (null removes one; a list is replaced whole); "
        "the others stay. Secrets by NAME, never values"
    )


class ChannelPublic(Public):
    name: str
    kind: ChannelKindWord
    config: dict[str, Any] = Field(description="the settings; secrets by name only")
    created_at: Timestamp
    updated_at: Timestamp


class ChannelList(Public):
    items: list[ChannelPublic]


class RuleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    name: str = Field(description="a lowercase slug, e.g. failures-to-ops")
    events: list[str] = Field(description="event names (run.failed), families (run.*) or *")
    channels: list[str] = Field(description="channel names")
    worker: str | None = Field(None, description="only this worker's events (default: all)")
    recovery: bool = Field(True, description="send the incident's recovery to the channels too")


class RuleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    enabled: bool = Field(description="false: the rule routes nothing until turned on again")


class RulePublic(Public):
    name: str
    worker: str | None
    events: list[str]
    channels: list[str]
    recovery: bool
    enabled: bool
    created_at: Timestamp


class RuleList(Public):
    items: list[RulePublic]


class AlertDeliveryPublic(Public):
    id: str
    purpose: DeliveryPurposeWord
    status: DeliveryStatusWord
    type: str = Field(description="the event: run.failed, recovered, test, run.ended, ...")
    channel: str | None = Field(description="the channel (alerts and tests)")
    target: str | None = Field(description="a callback's URL, without its query")
    run_id: str | None
    event_id: str | None
    summary: str
    attempts: int
    max_attempts: int
    next_attempt_at: Timestamp | None
    last_error: str | None
    created_at: Timestamp
    delivered_at: Timestamp | None
    body: dict[str, Any] = Field(description="what was (or is to be) sent")


class DeliveryQuery(BaseModel):
    """Which alert, test and callback deliveries to list, newest first, a page at a time: the
    one shape of GET /api/v1/alerts/deliveries's filters, the client's list_alert_deliveries,
    both MCP backends and the list_alert_deliveries tool, and `floom alerts deliveries`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str | None = None
    purpose: str | None = None
    channel: str | None = None
    run_id: str | None = None
    cursor: str | None = None
    limit: int = 50

    def params(self) -> dict[str, Any]:
        """As REST query parameters (unset ones left out)."""
        return self.model_dump(exclude_none=True)


class Deleted(Public):
    name: str
    deleted: bool


class CallbackKey(Public):
    key: str = Field(description="the Standard Webhooks key (whsec_...) that signs callbacks")


def channel_public(row: AlertChannel, *, full: bool = True) -> ChannelPublic:
    """A channel as answered; `full` False (a caller without the deploy scope) shows a
    webhook's URL as its origin only: many receivers take a token in the path or query."""
    config = jsonvalues.stored(row.config_json, expect=dict)
    if not full and isinstance(config.get("url"), str):
        config = {**config, "url": origin_only(config["url"])}
    return ChannelPublic(
        name=row.name,
        kind=row.kind,
        config=config,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def rule_public(row: AlertRule) -> RulePublic:
    return RulePublic(
        name=row.name,
        worker=row.worker_name,
        events=jsonvalues.stored_list(row.events_json, items=str),
        channels=jsonvalues.stored_list(row.channels_json, items=str),
        recovery=row.recovery,
        enabled=row.enabled,
        created_at=row.created_at,
    )


def shown_target(url: str | None, *, full: bool = True) -> str | None:
    """Where a delivery went, never with its query; without `full` (a caller without the
    deploy scope), its origin only."""
    if url is None:
        return None
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # a row's URL Python cannot split: shown as nothing, not a 500
        return None
    if not full:
        return origin_only(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def origin_only(url: str) -> str:
    """`url`'s scheme, host and port, with "/…" for a path or query left out (a token a
    receiver takes there is shown only to callers who may change the channel)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:  # a row's URL Python cannot split: shown as nothing of it
        return "…"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    origin = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    hidden = parts.path not in ("", "/") or parts.query or parts.fragment
    return origin + ("/…" if hidden else "")


def delivery_public(row: Delivery, *, full: bool = True) -> AlertDeliveryPublic:
    body = jsonvalues.stored(row.body_json, expect=dict)
    summary = body.get("summary")
    if summary is None and isinstance(body.get("run"), dict):
        run = body["run"]
        summary = f"run {run.get('id')} of {run.get('worker')} {run.get('status')}"
    return AlertDeliveryPublic(
        id=row.id,
        purpose=row.purpose,
        status=row.status,
        type=str(body.get("type") or row.purpose),
        channel=row.channel_name,
        target=shown_target(row.target, full=full),
        run_id=row.run_id,
        event_id=row.event_id,
        summary=str(summary or ""),
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        next_attempt_at=row.next_attempt_at if row.status == DeliveryStatus.PENDING else None,
        last_error=row.last_error,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
        body=body,
    )


def delivery_page(
    rows: list[Delivery], next_cursor: str | None, *, full: bool = True
) -> Page[AlertDeliveryPublic]:
    return Page[AlertDeliveryPublic](
        items=[delivery_public(r, full=full) for r in rows], next_cursor=next_cursor
    )
