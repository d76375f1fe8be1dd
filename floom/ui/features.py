"""The UI's view of features that other parts of floom provide: triggers (next fires, webhook
URL and deliveries) and approvals, shaped for the templates from their public models."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from floom.schemas import runs as run_views
from floom.schemas import triggers as trigger_views
from floom.schemas import workers as worker_views
from floom.services.access.principal import Principal
from floom.services.runs import approvals
from floom.services.triggers import registry as triggers
from floom.services.triggers import webhooks
from floom.views import triggers as trigger_answers
from floom.vocabulary import TriggerKind

if TYPE_CHECKING:
    from floom.services.access.sessions import SignedIn
    from floom.services.context import Context

NAV_COUNT_LIMIT = 500
RECENT_DELIVERIES = 10


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _wall(text: str | None) -> str | None:
    """The fire time as the schedule's own clock shows it (the text keeps its zone offset)."""
    return datetime.fromisoformat(text).strftime("%a %H:%M") if text else None


def _describe(kind: str, config: dict[str, Any]) -> str:
    if kind == TriggerKind.SCHEDULE:
        return f"cron {config.get('cron', '?')}"
    if kind == TriggerKind.WEBHOOK:
        return f"signed webhook ({config.get('signature', 'standard')})"
    if kind == TriggerKind.COMPOSIO:
        return f"Composio event {config.get('event', '?')}"
    return kind


def worker_triggers(
    ctx: Context, *, worker_name: str, base_url: str = "", caller: Principal
) -> list[dict[str, Any]]:
    """Each current trigger: kind, description, next fire and its timezone, webhook URL."""
    worker, rows = triggers.list_triggers(ctx, worker_name=worker_name, caller=caller)
    urls = triggers.HookUrls(ctx.settings.public_url or base_url)
    items = []
    for row in rows:
        # The public model REST and MCP answer with, so the page shows the same facts.
        t = trigger_answers.trigger_public(ctx, row, worker=worker, urls=urls, count=1)
        fires = t.next_fires
        items.append(
            {
                "id": t.id,
                "kind": t.kind,
                "description": _describe(t.kind, t.config),
                "next_fire": _instant(fires[0]) if fires else None,
                "next_fire_wall": _wall(fires[0]) if fires else None,
                "timezone": t.timezone,
                "paused": t.paused,
                "active": t.active,
                "webhook_url": t.url,
                "secret_name": t.config.get("secret") if t.kind == TriggerKind.WEBHOOK else None,
                "secret_set": t.secret_set,
                "last_fire_at": t.last_fire_at,
            }
        )
    return items


def trigger_summaries(summaries: list[worker_views.TriggerSummary]) -> list[dict[str, Any]]:
    """The short form for the workers list (from a worker's public model): kind, cron, next
    fire, timezone."""
    return [
        {
            "kind": t.kind,
            "description": _describe(t.kind, {"cron": t.cron}) if t.cron else "",
            "next_fire": _instant(t.next_fire),
            "next_fire_wall": _wall(t.next_fire),
            "timezone": t.timezone,
            "paused": t.paused,
            "active": t.active,
        }
        for t in summaries
    ]


def webhook_deliveries(
    ctx: Context, *, worker_name: str, caller: Principal
) -> list[trigger_views.DeliveryPublic]:
    """The newest deliveries to the worker's webhook (and Composio events), newest first."""
    rows, _ = webhooks.list_deliveries(
        ctx, worker_name=worker_name, limit=RECENT_DELIVERIES, caller=caller
    )
    return [trigger_views.DeliveryPublic.of(d) for d in rows]


def approval_view(approval: run_views.ApprovalPublic) -> dict[str, Any]:
    """An approval's public model, with its proposal as the edit box shows it."""
    body = approval.model_dump()
    body["proposed_text"] = json.dumps(body["proposed"], indent=2, ensure_ascii=False)
    return body


def pending_approvals(
    ctx: Context, *, limit: int = NAV_COUNT_LIMIT, caller: Principal
) -> list[dict[str, Any]]:
    """Everything waiting for a person, oldest first."""
    rows, _ = approvals.list_approvals(ctx, status=approvals.PENDING, limit=limit, caller=caller)
    return [approval_view(run_views.ApprovalPublic.of(a)) for a in rows]


def decide(
    ctx: Context,
    *,
    approval_id: str,
    decision: str,
    edited: dict[str, Any] | None,
    comment: str | None,
    caller: Principal,
) -> None:
    approvals.decide_approval(
        ctx,
        approval_id=approval_id,
        decision=decision,
        edited=edited,
        comment=comment,
        caller=caller,
    )


def proposed_of(ctx: Context, *, approval_id: str, caller: Principal) -> dict[str, Any]:
    approval = approvals.get_approval(ctx, approval_id=approval_id, caller=caller)
    value = run_views.ApprovalPublic.of(approval).proposed
    return value if isinstance(value, dict) else {}


def nav_counts(ctx: Context, me: SignedIn) -> dict[str, Any]:
    rows, _ = approvals.list_approvals(
        ctx, status=approvals.PENDING, limit=NAV_COUNT_LIMIT, caller=me.caller
    )
    return {"approvals_count": len(rows)}
