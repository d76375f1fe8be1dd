"""Alert rules, as worker.yml's `alerts:` section and the global rules of the REST API write
them: which events go to which channels. The event catalogue lives here, so a rule is checked
against it wherever it comes from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from floom.hints import act, told
from floom.manifest.fields import kind_of, suggest
from floom.manifest.schema import NAME_PATTERN, Problem

# What the alert watch reports (floom/services/alerts/watch.py), with what each means.
EVENTS: dict[str, str] = {
    "run.failed": "a run ended failed",
    "run.timed_out": "a run ended timed out",
    "run.limit_exceeded": "a run ended over one of its limits",
    "run.rejected": "a person rejected a run's outputs",
    "approval.waiting": "a run waited for approval past FLOOM_ALERT_APPROVAL_WAIT_SECONDS",
    "schedule.missed": "a schedule's tick did not become a run within the grace time",
    "schedule.late": "a schedule's run had not started within the grace time",
    "schedule.stuck": "a schedule's run had not ended within FLOOM_ALERT_SCHEDULE_STUCK_SECONDS",
    "trigger.failed": "a verified webhook or Composio delivery could not start a run",
    "node.lost": "a node stopped renewing its heartbeat",
}
# Sent when an incident ends (to the rules that matched its first event, unless they say
# `recovery: false`), and by a channel's test; neither is a rule's event.
RECOVERED = "recovered"
TEST = "test"
# Events about no worker: a worker's own rules cannot ask for them.
CLUSTER_EVENTS = frozenset({"node.lost"})
RULE_KEYS = ("events", "channels", "recovery")
MAX_RULES = 20
MAX_RULE_CHANNELS = 10
EXAMPLE = "alerts: [{events: [run.failed, schedule.missed], channels: [ops-email]}]"


@dataclass(frozen=True)
class RuleSpec:
    """A checked rule: event patterns ("run.failed", "run.*", "*"), channel names."""

    events: tuple[str, ...]
    channels: tuple[str, ...]
    recovery: bool = True

    def matches(self, kind: str) -> bool:
        return any(matches(pattern, kind) for pattern in self.events)


def matches(pattern: str, kind: str) -> bool:
    if pattern in ("*", kind):
        return True
    return pattern.endswith(".*") and kind.startswith(pattern[:-1])


def _check_pattern(item: Any, path: str, out: list[Problem], *, worker_scoped: bool) -> bool:
    if not isinstance(item, str):
        out.append(Problem(path, f"must be an event name, got {kind_of(item)}", _EVENTS_HINT))
        return False
    if item == "*" or item in EVENTS:
        if worker_scoped and item in CLUSTER_EVENTS:
            hint = told(
                "a node is not a worker's: alert on it in a global rule (", act("alerts rules"), ")"
            )
            out.append(Problem(path, f"'{item}' is not about a worker", hint))
            return False
        return True
    if item.endswith(".*") and any(e.startswith(item[:-1]) for e in EVENTS):
        return True
    out.append(Problem(path, f"unknown event '{item}'", suggest(item, EVENTS, noun="events")))
    return False


_EVENTS_HINT = "events: " + ", ".join(EVENTS) + ", a family such as run.*, or * for every one"


def check_rule(raw: Any, path: str, out: list[Problem], *, worker_scoped: bool) -> RuleSpec | None:
    """One rule ({events, channels, recovery}) checked into `out`; the rule, or None."""
    if not isinstance(raw, Mapping):
        out.append(Problem(path, f"must be a mapping, got {kind_of(raw)}", f"e.g. {EXAMPLE}"))
        return None
    before = len(out)
    for key in raw:
        if key not in RULE_KEYS:
            out.append(
                Problem(f"{path}.{key}", f"unknown key '{key}'", suggest(str(key), RULE_KEYS))
            )
    events = _names(raw.get("events"), f"{path}.events", out, _EVENTS_HINT)
    for i, item in enumerate(events):
        _check_pattern(item, f"{path}.events[{i}]", out, worker_scoped=worker_scoped)
    channels = _names(raw.get("channels"), f"{path}.channels", out, "channel names, e.g. [ops]")
    if len(channels) > MAX_RULE_CHANNELS:
        out.append(
            Problem(
                f"{path}.channels",
                f"lists {len(channels)} channels",
                f"at most {MAX_RULE_CHANNELS}",
            )
        )
    for i, name in enumerate(channels):
        if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
            hint = "a channel's name: a lowercase slug, e.g. ops-email"
            out.append(Problem(f"{path}.channels[{i}]", f"{name!r} is not a channel name", hint))
    recovery = raw.get("recovery", True)
    if not isinstance(recovery, bool):
        out.append(Problem(f"{path}.recovery", f"must be true or false, got {kind_of(recovery)}"))
    if len(out) > before:
        return None
    return RuleSpec(events=tuple(events), channels=tuple(channels), recovery=bool(recovery))


def _names(raw: Any, path: str, out: list[Problem], hint: str) -> list[Any]:
    if raw is None:
        out.append(Problem(path, "required", hint))
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        out.append(Problem(path, f"must be a non-empty list, got {kind_of(raw)}", hint))
        return []
    if len(set(map(repr, raw))) != len(raw):
        out.append(Problem(path, "lists a name twice", "list each once"))
    return list(raw)


def check_alerts(raw: Any, path: str, out: list[Problem]) -> list[dict[str, Any]] | None:
    """worker.yml's `alerts:` (a list of rules) checked into `out`; the clean list, or None."""
    if not isinstance(raw, list):
        out.append(Problem(path, f"must be a list of rules, got {kind_of(raw)}", f"e.g. {EXAMPLE}"))
        return None
    if len(raw) > MAX_RULES:
        out.append(Problem(path, f"lists {len(raw)} rules", f"at most {MAX_RULES}"))
        return None
    clean = []
    for i, item in enumerate(raw):
        rule = check_rule(item, f"{path}[{i}]", out, worker_scoped=True)
        if rule is not None:
            clean.append(
                {
                    "events": list(rule.events),
                    "channels": list(rule.channels),
                    "recovery": rule.recovery,
                }
            )
    return clean if len(clean) == len(raw) else None


def worker_rules(alerts: list[dict[str, Any]]) -> list[RuleSpec]:
    """A validated manifest's `alerts:` as rules."""
    return [
        RuleSpec(
            events=tuple(item["events"]),
            channels=tuple(item["channels"]),
            recovery=bool(item.get("recovery", True)),
        )
        for item in alerts
    ]
