"""Alert rules: global ones (stored, for every worker or one) and each worker's own
(worker.yml `alerts:`, read from its active version). Both say which events go to which
channels; `routes_for` answers, for one event, the channels it goes to."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.cut import cut
from floom.errors import Conflict, InvalidRequest, NotFound, quoted
from floom.hints import Told, act, told
from floom.manifest.alerts import RuleSpec, check_rule, worker_rules
from floom.manifest.schema import NAME_PATTERN, Problem
from floom.services.access.principal import Principal
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import AlertChannel, AlertRule, Version, Worker, new_id

if TYPE_CHECKING:
    from floom.services.context import Context


# A refusal names the first few problems and quotes a bounded part of what was sent: a body of
# thousands of bad events answers in a few lines, not their whole size again.
SHOWN_PROBLEMS = 5
MAX_DETAILS = 50
QUOTED = 80


class RuleInvalid(InvalidRequest):
    """An alert rule that cannot be used; `details` names each field that is wrong."""

    status = 422
    code = "alert_rule_invalid"


@dataclass(frozen=True)
class Route:
    """Where one event goes: a channel, and whether its incident's recovery goes there too."""

    channel: AlertChannel
    recovery: bool
    rule: str  # the rule's name, or "worker.yml of NAME"


def check(raw: Any, *, path: str = "", worker_scoped: bool = False) -> RuleSpec:
    """A rule's {events, channels, recovery}, or RuleInvalid naming every bad field."""
    out: list[Problem] = []
    spec = check_rule(raw, path, out, worker_scoped=worker_scoped)
    if spec is None:
        first = out[0] if out else Problem(path, "is not a rule")
        said = "; ".join(f"{p.path.lstrip('.')}: {p.message}" for p in out[:SHOWN_PROBLEMS])
        if len(out) > SHOWN_PROBLEMS:
            said += f"; and {len(out) - SHOWN_PROBLEMS} more"
        raise RuleInvalid(
            said,
            hint=first.hint or "e.g. {events: [run.failed], channels: [ops]}",
            details=[{**p.to_dict(), "path": p.path.lstrip(".")} for p in out[:MAX_DETAILS]],
        )
    return spec


def create_rule(
    ctx: Context,
    *,
    name: str,
    events: Any,
    channels: Any,
    worker: str | None = None,
    recovery: Any = True,
    caller: Principal,
) -> AlertRule:
    """Save a global rule (for `worker` only, when given). Every channel it names must
    exist. Needs the deploy scope; a bad field raises RuleInvalid and saves nothing."""
    caller.require("deploy")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        hint = "a lowercase slug, e.g. failures-to-ops"
        raise RuleInvalid(
            f"name: {_quoted(name)} is not a rule name", hint=hint, details=[_detail("name", hint)]
        )
    spec = check({"events": events, "channels": channels, "recovery": recovery})
    if worker is not None:
        workers.get_worker(ctx, name=worker, caller=caller)
    row = AlertRule(
        id=new_id("arl"),
        name=name,
        worker_name=worker,
        events_json=json.dumps(list(spec.events)),
        channels_json=json.dumps(list(spec.channels)),
        recovery=spec.recovery,
    )
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "deploy")
            _check_channels_exist(s, spec.channels)
            s.add(row)
    except IntegrityError as exc:
        raise Conflict(f"an alert rule named {name} exists", hint="pick another name") from exc
    return row


def _quoted(value: Any) -> str:
    """`value` as a refusal quotes it: at most QUOTED characters of what a caller sent."""
    text = repr(value)
    return cut(text, QUOTED)


def _detail(path: str, hint: Told) -> dict[str, Any]:
    return {"path": path, "message": "invalid", "hint": hint}


def _check_channels_exist(s: Session, names: tuple[str, ...]) -> None:
    found = set(s.exec(select(AlertChannel.name).where(col(AlertChannel.name).in_(names))).all())
    for i, name in enumerate(names):
        if name not in found:
            hint = told("create it first: ", act("alerts channels add", name=name))
            detail = {"message": f"no channel {name}", "hint": hint}
            raise RuleInvalid(
                f"channels[{i}]: no alert channel named {name}",
                hint=hint,
                details=[{"path": f"channels[{i}]", **detail}],
            )


def list_rules(ctx: Context, *, caller: Principal) -> list[AlertRule]:
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(AlertRule).order_by(col(AlertRule.name))).all())


def set_enabled(ctx: Context, *, name: str, enabled: Any, caller: Principal) -> AlertRule:
    """Turn a global rule on or off (a disabled rule routes nothing but is kept). Needs the
    deploy scope; `enabled` must be a boolean (RuleInvalid names it otherwise)."""
    caller.require("deploy")
    if not isinstance(enabled, bool):
        hint = "true or false"
        raise RuleInvalid(
            f"enabled: {_quoted(enabled)} is not true or false",
            hint=hint,
            details=[_detail("enabled", hint)],
        )
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.exec(select(AlertRule).where(AlertRule.name == name)).first()
        if row is None:
            raise _no_rule(name)
        row.enabled = enabled
        s.add(row)
    return row


def _no_rule(name: str) -> NotFound:
    return NotFound(
        f"no alert rule named {quoted(name)}", hint=told(act("alerts rules"), " lists them")
    )


def delete_rule(ctx: Context, *, name: str, caller: Principal) -> None:
    caller.require("deploy")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.exec(select(AlertRule).where(AlertRule.name == name)).first()
        if row is None:
            raise _no_rule(name)
        s.delete(row)


def spec_of(row: AlertRule) -> RuleSpec:
    """The stored rule; what of it cannot be read back (a row written by hand or by another
    program) matches no event and names no channel."""
    return RuleSpec(
        events=tuple(e for e in jsonvalues.stored_list(row.events_json, items=str) if _named(e)),
        channels=tuple(
            c for c in jsonvalues.stored_list(row.channels_json, items=str) if _named(c)
        ),
        recovery=row.recovery,
    )


def _named(item: str) -> bool:
    return not item.startswith(f"({jsonvalues.UNREADABLE}")


def routes_for(s: Session, *, kind: str, worker: str | None) -> list[Route]:
    """The channels an event of `kind` (about `worker`, if any) goes to: by the global rules
    and the worker's own; each channel once. A rule naming a channel that no longer exists
    skips it."""
    named: list[tuple[RuleSpec, str]] = []
    for row in s.exec(select(AlertRule).where(col(AlertRule.enabled).is_(True))).all():
        if row.worker_name is None or row.worker_name == worker:
            named.append((spec_of(row), row.name))
    if worker is not None:
        named += [(spec, f"worker.yml of {worker}") for spec in _worker_specs(s, worker)]
    wanted = [(spec, rule) for spec, rule in named if spec.matches(kind)]
    names = {channel for spec, _ in wanted for channel in spec.channels}
    if not names:
        return []
    channels = {
        c.name: c
        for c in s.exec(select(AlertChannel).where(col(AlertChannel.name).in_(sorted(names)))).all()
    }
    routes: dict[str, Route] = {}
    for spec, rule in wanted:
        for name in spec.channels:
            if name in channels and (name not in routes or spec.recovery):
                routes[name] = Route(channel=channels[name], recovery=spec.recovery, rule=rule)
    return list(routes.values())


def _worker_specs(s: Session, worker: str) -> list[RuleSpec]:
    row = s.exec(
        select(Version)
        .join(Worker, col(Worker.active_version_id) == col(Version.id))
        .where(Worker.name == worker)
    ).first()
    if row is None:
        return []
    try:
        return worker_rules(workers.manifest_of(row).alerts)
    except workers.ManifestUnreadable:
        return []  # no rules can be read from it; the global rules still route
