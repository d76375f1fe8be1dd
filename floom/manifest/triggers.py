"""Checks of worker.yml's triggers, into friendly problems with paths and hints: each
trigger's settings, and how schedule inputs and webhook or Composio events reach the
worker's declared inputs."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from floom.errors import FloomError, InputInvalid, ManifestInvalid
from floom.manifest.schema import TRIGGER_KINDS, FieldSpec, Manifest, Problem, format_problems
from floom.triggers import cron
from floom.triggers.spec import (
    CATCH_UP_POLICIES,
    DEFAULT_CATCH_UP_WINDOW,
    EVENT_INPUT,
    EVENT_INPUT_TYPES,
    MAX_CATCH_UP_WINDOW,
    MIN_CATCH_UP_WINDOW,
    OVERLAP_POLICIES,
    RESERVED_HOOK_NAMES,
    SIGNATURE_KINDS,
    ComposioSpec,
    HandoffSpec,
    ScheduleSpec,
    TriggerSpec,
    WebhookSpec,
    callback_origin,
    parse_duration,
    trigger_key,
)
from floom.vocabulary import TriggerKind

_SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SLUG = re.compile(r"^[A-Z0-9_]+$")
_PATH = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
_KEYS = {
    "schedule": ("cron", "timezone", "overlap", "catch_up", "catch_up_window", "inputs"),
    "webhook": ("signature", "secret", "inputs", "callbacks"),
    "composio": ("event", "connected_account", "filters", "inputs", "callback_url"),
}


def parse_triggers(manifest: Manifest) -> list[TriggerSpec]:
    """The manifest's triggers as specs; raises ManifestInvalid when one is not valid."""
    problems: list[Problem] = []
    specs = _check_all(manifest.triggers, _inputs_of(manifest), manifest.name, problems)
    if problems:
        raise ManifestInvalid(
            f"the triggers of '{manifest.name}' are not valid:\n{format_problems(problems)}",
            hint="fix worker.yml and deploy it again",
            details=[p.to_dict() for p in problems],
        )
    return specs


def check_triggers(
    raw: Any, inputs: Mapping[str, Any], worker_name: str, out: list[Problem]
) -> None:
    """Problems with the settings of each well-shaped trigger (worker.yml checks the shape),
    including how webhook and Composio events and schedule inputs reach the declared inputs."""
    if isinstance(raw, list):
        _check_all(raw, inputs, worker_name, out)


def _inputs_of(manifest: Manifest) -> dict[str, Any]:
    return {name: spec.model_dump() for name, spec in manifest.inputs.items()}


def _check_all(
    raw: list[Any], inputs: Mapping[str, Any], worker_name: str, out: list[Problem]
) -> list[TriggerSpec]:
    specs: list[TriggerSpec] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or len(item) != 1:
            continue  # the shape check has reported it
        ((kind, settings),) = item.items()
        if kind not in TRIGGER_KINDS:
            continue
        if settings is not None and not isinstance(settings, Mapping):
            continue
        path = f"triggers[{i}].{kind}"
        before = len(out)
        spec = _check_one(kind, dict(settings or {}), path, inputs, worker_name, out)
        if spec is None or len(out) > before:
            continue
        key = trigger_key(spec)
        if key in seen:
            what = "a second webhook" if kind == TriggerKind.WEBHOOK else "the same trigger"
            hint = (
                "a worker has one webhook URL; use one webhook trigger"
                if kind == TriggerKind.WEBHOOK
                else f"it repeats {seen[key]}; list it once"
            )
            out.append(_problem(path, f"{what} as {seen[key]}", hint))
            continue
        seen[key] = f"triggers[{i}]"
        specs.append(spec)
    return specs


def _check_one(
    kind: str,
    settings: dict[str, Any],
    path: str,
    inputs: Mapping[str, Any],
    worker_name: str,
    out: list[Problem],
) -> TriggerSpec | None:
    if kind == TriggerKind.HANDOFF:
        return _check_handoff(settings, path, out)
    allowed = _KEYS[kind]
    for key in settings:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"{kind} takes {', '.join(allowed)}"
            out.append(_problem(f"{path}.{key}", f"unknown setting '{key}'", hint))
    if kind == TriggerKind.SCHEDULE:
        return _check_schedule(settings, path, inputs, out)
    if kind == TriggerKind.WEBHOOK:
        if worker_name in RESERVED_HOOK_NAMES:
            out.append(
                _problem(
                    path,
                    f"a worker named '{worker_name}' cannot have a webhook: "
                    f"/hooks/{worker_name} receives Composio's events",
                    "rename the worker",
                )
            )
        return _check_webhook(settings, path, inputs, out)
    return _check_composio(settings, path, inputs, out)


def _check_handoff(settings: dict[str, Any], path: str, out: list[Problem]) -> HandoffSpec | None:
    role = settings.get("role")
    for key in settings:
        if key != "role":
            out.append(_problem(f"{path}.{key}", f"unknown setting '{key}'", "handoff takes role"))
    if not isinstance(role, str) or not role.strip():
        out.append(
            _problem(
                f"{path}.role",
                "a handoff trigger needs the role whose jobs this worker takes",
                "e.g. `- handoff: {role: reviewer}`",
            )
        )
        return None
    return HandoffSpec(settings={"role": role.strip()})


def _check_schedule(
    settings: dict[str, Any], path: str, inputs: Mapping[str, Any], out: list[Problem]
) -> ScheduleSpec | None:
    expr = settings.get("cron")
    if expr is None:
        out.append(_problem(f"{path}.cron", "required", 'e.g. cron: "0 9 * * mon-fri"'))
        return None
    timezone = settings.get("timezone") or "UTC"
    valid = True
    try:
        expr = cron.normalise(str(expr))
    except cron.CronError as exc:
        hint = "5 fields: minute hour day-of-month month day-of-week, e.g. '0 9 * * mon-fri'"
        out.append(_problem(f"{path}.cron", str(exc), hint))
        valid = False
    try:
        tz = cron.zone(str(timezone))
    except cron.CronError as exc:
        close = difflib.get_close_matches(str(timezone)[:100], _zone_names(), n=1)
        hint = exc.hint or (f"did you mean '{close[0]}'?" if close else "e.g. Europe/Berlin or UTC")
        out.append(_problem(f"{path}.timezone", str(exc), hint))
        valid = False
    if valid and not cron.next_fire_times(expr, tz, after=datetime.now(UTC), count=1):
        out.append(_problem(f"{path}.cron", f"'{expr}' never fires", "check the day and month"))
    overlap = _choice(settings, "overlap", OVERLAP_POLICIES, "skip", path, out)
    catch_up = _choice(settings, "catch_up", CATCH_UP_POLICIES, "latest", path, out)
    window = DEFAULT_CATCH_UP_WINDOW
    if settings.get("catch_up_window") is not None:
        try:
            window = parse_duration(settings["catch_up_window"])
            if not MIN_CATCH_UP_WINDOW <= window <= MAX_CATCH_UP_WINDOW:
                raise ValueError(window)
        except ValueError:
            out.append(
                _problem(
                    f"{path}.catch_up_window",
                    f"{settings['catch_up_window']!r} is not a duration from 1m to 7d",
                    'e.g. "24h", "30m" or a number of seconds',
                )
            )
    given = settings.get("inputs") or {}
    if not isinstance(given, Mapping):
        out.append(_problem(f"{path}.inputs", "must be a mapping of input name to value"))
        given = {}
    else:
        _check_inputs_complete(dict(given), inputs, f"{path}.inputs", out)
    return ScheduleSpec(
        cron=expr,
        timezone=str(timezone),
        overlap=overlap,
        catch_up=catch_up,
        catch_up_window=window,
        inputs=dict(given),
    )


def _check_webhook(
    settings: dict[str, Any], path: str, inputs: Mapping[str, Any], out: list[Problem]
) -> WebhookSpec | None:
    signature = _choice(settings, "signature", SIGNATURE_KINDS, "standard", path, out)
    secret = settings.get("secret")
    if not isinstance(secret, str) or not _SECRET_NAME.fullmatch(secret):
        message = "required" if secret is None else f"{secret!r} is not a secret name"
        hint = "the name of a floom secret holding the signing key, e.g. secret: GH_HOOK_SECRET"
        out.append(_problem(f"{path}.secret", message, hint))
        return None
    mapping = _check_event_delivery(settings, path, inputs, out)
    callbacks = _check_callback_origins(settings.get("callbacks"), f"{path}.callbacks", out)
    return WebhookSpec(signature=signature, secret=secret, inputs=mapping, callbacks=callbacks)


MAX_CALLBACK_ORIGINS = 10
# An origin as written: scheme, host (a name, an IPv4 or a bracketed IPv6) and a port.
_ORIGIN = re.compile(r"^https?://([A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?/?$")


def _check_callback_origins(raw: Any, path: str, out: list[Problem]) -> list[str]:
    """A webhook's `callbacks`: the origins its deliveries' `?callback_url=` may name."""
    if raw is None:
        return []
    hint = "e.g. callbacks: [https://ci.example.com] (scheme, host and port only)"
    if not isinstance(raw, list) or len(raw) > MAX_CALLBACK_ORIGINS:
        message = f"must be a list of at most {MAX_CALLBACK_ORIGINS} origins"
        out.append(_problem(path, message, hint))
        return []
    origins: list[str] = []
    for i, origin in enumerate(raw):
        found = callback_origin(origin) if isinstance(origin, str) else None
        if found is None or not _ORIGIN.fullmatch(origin):
            shown = origin[:80] if isinstance(origin, str) else type(origin).__name__
            out.append(_problem(f"{path}[{i}]", f"{shown!r} is not an http(s) origin", hint))
            continue
        origins.append(found)
    return origins


def _check_composio(
    settings: dict[str, Any], path: str, inputs: Mapping[str, Any], out: list[Problem]
) -> ComposioSpec | None:
    event = settings.get("event")
    if not isinstance(event, str) or not _SLUG.fullmatch(event.upper()):
        message = "required" if event is None else f"{event!r} is not a Composio trigger slug"
        out.append(_problem(f"{path}.event", message, "e.g. event: GITHUB_COMMIT_EVENT"))
        return None
    account = settings.get("connected_account")
    if account is not None and not isinstance(account, str):
        out.append(_problem(f"{path}.connected_account", "must be a connected account id"))
    filters = settings.get("filters") or {}
    if not isinstance(filters, Mapping):
        out.append(_problem(f"{path}.filters", "must be a mapping of field path to value"))
        filters = {}
    for key, value in filters.items():
        values = value if isinstance(value, list) else [value]
        if not _PATH.fullmatch(str(key)) or any(isinstance(v, dict | list) for v in values):
            out.append(
                _problem(
                    f"{path}.filters.{key}",
                    "a filter is a field path of the event data and a value (or list of values)",
                    "e.g. filters: {repo: acme/api}",
                )
            )
    callback = settings.get("callback_url")
    if callback is not None and (
        not isinstance(callback, str) or not re.fullmatch(r"^https?://[^\s]+$", callback)
    ):
        hint = "e.g. callback_url: https://ci.example.com/floom-done"
        out.append(_problem(f"{path}.callback_url", "must be an http(s) URL", hint))
    mapping = _check_event_delivery(settings, path, inputs, out)
    return ComposioSpec(
        event=event.upper(),
        connected_account=account if isinstance(account, str) else None,
        filters=dict(filters),
        inputs=mapping,
        callback_url=callback if isinstance(callback, str) else None,
    )


def _check_event_delivery(
    settings: dict[str, Any], path: str, inputs: Mapping[str, Any], out: list[Problem]
) -> dict[str, str]:
    """An event reaches the worker as its `event` input, or through `inputs:` field paths."""
    mapping = settings.get("inputs") or {}
    if not isinstance(mapping, Mapping):
        out.append(_problem(f"{path}.inputs", "must map input names to field paths"))
        return {}
    clean: dict[str, str] = {}
    for name, field_path in mapping.items():
        where = f"{path}.inputs.{name}"
        if name not in inputs:
            out.append(_problem(where, f"'{name}' is not a declared input", "declare it first"))
        elif not isinstance(field_path, str) or not _PATH.fullmatch(field_path):
            out.append(
                _problem(where, "must be a field path of the body", "e.g. repository.full_name")
            )
        else:
            clean[name] = field_path
    event = inputs.get(EVENT_INPUT)
    if event is not None and (event.get("type") or "string") not in EVENT_INPUT_TYPES:
        out.append(
            _problem(
                f"inputs.{EVENT_INPUT}",
                f"the '{EVENT_INPUT}' input receives the request body: type object or string",
                f"declare {EVENT_INPUT}: object (JSON bodies) or {EVENT_INPUT}: string",
            )
        )
    if event is None and not mapping:
        out.append(
            _problem(
                path,
                f"the event has nowhere to go: declare an '{EVENT_INPUT}' input or map fields "
                "to inputs",
                f"add `inputs: {{{EVENT_INPUT}: object}}` to worker.yml, or "
                "`inputs: {repo: repository.full_name}` to this trigger",
            )
        )
    for name, spec in inputs.items():
        given = name in clean or name == EVENT_INPUT
        if spec.get("required") and spec.get("default") is None and not given:
            out.append(
                _problem(
                    f"{path}.inputs",
                    f"the required input '{name}' gets no value from the event",
                    f"map it, e.g. inputs: {{{name}: some.field}}",
                )
            )
    return clean


def _check_inputs_complete(
    given: dict[str, Any], inputs: Mapping[str, Any], path: str, out: list[Problem]
) -> None:
    try:
        fields = {name: FieldSpec.model_validate(spec) for name, spec in inputs.items()}
        Manifest.model_construct(name="w", entry="run.py", inputs=fields).coerce_inputs(given)
    except InputInvalid as exc:
        out.append(_problem(path, exc.message, exc.hint))
    except (FloomError, ValueError):
        pass  # the inputs section has its own problems, reported there


def _choice(
    settings: Mapping[str, Any],
    key: str,
    choices: Iterable[str],
    default: str,
    path: str,
    out: list[Problem],
) -> str:
    value = settings.get(key)
    if value is None:
        return default
    options = tuple(choices)
    if value not in options:
        close = difflib.get_close_matches(str(value), options, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"one of {', '.join(options)}"
        out.append(_problem(f"{path}.{key}", f"{value!r} is not one of {', '.join(options)}", hint))
        return default
    return str(value)


def _problem(path: str, message: str, hint: str | None = None) -> Problem:
    return Problem(path, message, hint)


def _zone_names() -> list[str]:
    from zoneinfo import available_timezones

    return sorted(n for n in available_timezones() if not cron.host_file(n))
