"""The triggers of worker.yml as values: their settings with defaults, and the identity that
keeps a trigger (its id and last fire) across redeploys. floom/manifest/triggers.py checks
them."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from floom.vocabulary import TriggerKind

OVERLAP_POLICIES = ("skip", "queue", "allow", "cancel_running")
CATCH_UP_POLICIES = ("none", "latest", "all")
SIGNATURE_KINDS = ("standard", "github", "hmac-sha256")
DEFAULT_CATCH_UP_WINDOW = 24 * 3600.0
MAX_CATCH_UP_WINDOW = 7 * 24 * 3600.0
MIN_CATCH_UP_WINDOW = 60.0
EVENT_INPUT = "event"
EVENT_INPUT_TYPES = ("object", "string")
# /hooks/composio receives Composio's events, so no worker of that name can own the URL.
RESERVED_HOOK_NAMES = frozenset({"composio"})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class ScheduleSpec:
    cron: str
    timezone: str = "UTC"
    overlap: str = "skip"
    catch_up: str = "latest"
    catch_up_window: float = DEFAULT_CATCH_UP_WINDOW
    inputs: dict[str, Any] = field(default_factory=dict)
    kind: TriggerKind = TriggerKind.SCHEDULE

    def identity(self) -> dict[str, Any]:
        # Policies and inputs may change without moving the fire times: the trigger stays.
        return {"cron": self.cron, "timezone": self.timezone}


@dataclass(frozen=True)
class WebhookSpec:
    secret: str
    signature: str = "standard"
    inputs: dict[str, str] = field(default_factory=dict)
    # The origins (`https://ci.example.com`) a delivery's `?callback_url=` may name: the
    # query is outside what any signature scheme signs, so the worker.yml says where a run's
    # record may go, not the request. None listed: a delivery names no callback.
    callbacks: list[str] = field(default_factory=list)
    kind: TriggerKind = TriggerKind.WEBHOOK

    def identity(self) -> dict[str, Any]:
        return {}  # one webhook URL per worker


@dataclass(frozen=True)
class ComposioSpec:
    event: str
    connected_account: str | None = None
    filters: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    # Where each of its runs' records goes when the run ends (not part of its identity: a new
    # URL keeps the trigger). Checked by the egress guard at deploy.
    callback_url: str | None = None
    kind: TriggerKind = TriggerKind.COMPOSIO

    def identity(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "connected_account": self.connected_account,
            "filters": self.filters,
        }


@dataclass(frozen=True)
class HandoffSpec:
    """Accepted and stored; the handoff layer gives it meaning."""

    settings: dict[str, Any] = field(default_factory=dict)
    kind: TriggerKind = TriggerKind.HANDOFF

    def identity(self) -> dict[str, Any]:
        return self.settings


TriggerSpec = ScheduleSpec | WebhookSpec | ComposioSpec | HandoffSpec


def trigger_key(spec: TriggerSpec) -> str:
    """Stable across redeploys while the trigger's identity is unchanged."""
    text = json.dumps({"kind": spec.kind, **spec.identity()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def spec_to_config(spec: TriggerSpec) -> dict[str, Any]:
    if isinstance(spec, HandoffSpec):
        return dict(spec.settings)
    body = {k: v for k, v in spec.__dict__.items() if k != "kind"}
    if isinstance(spec, ComposioSpec) and spec.callback_url is None:
        del body["callback_url"]  # stored as before: a node of an older floom reads it
    if isinstance(spec, WebhookSpec) and not spec.callbacks:
        del body["callbacks"]  # likewise
    settings: dict[str, Any] = json.loads(json.dumps(body, default=str))
    return settings


def spec_from_config(kind: str, config: Mapping[str, Any]) -> TriggerSpec:
    """Rebuild a stored (already checked) trigger."""
    if kind == TriggerKind.SCHEDULE:
        return ScheduleSpec(**config)
    if kind == TriggerKind.WEBHOOK:
        return WebhookSpec(**config)
    if kind == TriggerKind.COMPOSIO:
        return ComposioSpec(**config)
    return HandoffSpec(settings=dict(config))


_DEFAULT_PORTS = {"http": 80, "https": 443}


def callback_origin(url: str) -> str | None:
    """`scheme://host[:port]` of an http(s) URL, lower case, the scheme's default port left
    out; None when it has none (or Python cannot split it)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    shown_port = "" if port in (None, _DEFAULT_PORTS[scheme]) else f":{port}"
    return f"{scheme}://{host}{shown_port}"


def parse_duration(value: Any) -> float:
    """Seconds from 90, "90s", "30m", "24h", "7d" or "1w"; raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.fullmatch(str(value))
    if not match:
        raise ValueError(value)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
