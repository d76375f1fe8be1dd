"""The `replay:` section of worker.yml: tools a what-if replay may call live, how evals compare
each output, and the eval gate on deploy. Checked into friendly problems at deploy, read into
ReplayRules by replays and evals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from floom.manifest.agent import TOOL_NAME, tool_specs
from floom.manifest.schema import Manifest, Problem

KEYS = ("live_tools", "compare", "gate")
GATE_KEYS = ("runs", "max_different")
COMPARE_RULES = ("exact", "any_string")
MAX_GATE_RUNS = 50
# Builtins that act outside the replay's own run (another run, a person, the worker's
# memory, a sandbox with its own network), so a replay never calls them live.
NEVER_LIVE = ("invoke_worker", "request_approval", "remember", "run_command")
COMPARE_HINT = "each output: exact, any_string, or {tolerance: 0.01}"


@dataclass(frozen=True)
class EvalGate:
    runs: int = 10
    max_different: int = 0


@dataclass(frozen=True)
class ReplayRules:
    live_tools: frozenset[str] = frozenset()
    compare: dict[str, Any] = field(default_factory=dict)
    gate: EvalGate | None = None


def replay_rules(manifest: Manifest) -> ReplayRules:
    """The manifest's replay section, read from the shape `check_replay` guaranteed."""
    raw = manifest.replay or {}
    gate = raw.get("gate")
    return ReplayRules(
        live_tools=frozenset(raw.get("live_tools") or ()),
        compare=dict(raw.get("compare") or {}),
        gate=EvalGate(**gate) if isinstance(gate, Mapping) else None,
    )


def check_replay(doc: Mapping[Any, Any], clean: dict[str, Any], out: list[Problem]) -> None:
    """Problems with `replay:`; a clean copy goes into `clean["replay"]` when there are none."""
    raw = doc.get("replay")
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        out.append(Problem("replay", "must be a mapping", f"keys: {', '.join(KEYS)}"))
        return
    before = len(out)
    for key in raw:
        if key not in KEYS:
            out.append(Problem(f"replay.{key}", f"unknown key '{key}'", f"keys: {', '.join(KEYS)}"))
    _check_live_tools(raw.get("live_tools"), doc, out)
    _check_compare(raw.get("compare"), clean, out)
    _check_gate(raw.get("gate"), out)
    if len(out) == before:
        clean["replay"] = {k: raw[k] for k in KEYS if raw.get(k) is not None}


def _check_live_tools(raw: Any, doc: Mapping[Any, Any], out: list[Problem]) -> None:
    if raw is None:
        return
    if not isinstance(raw, list):
        out.append(Problem("replay.live_tools", "must be a list of tool names", "e.g. [fetch]"))
        return
    builtins: dict[str, str] = {}
    gated: set[str] = set()
    try:
        shape = Manifest.model_construct(name="", entry="", tools=list(doc.get("tools") or []))
        specs = tool_specs(shape)
    except (TypeError, ValueError, KeyError, AttributeError):
        specs = []  # the tools section has its own problems, reported there
    for spec in specs:
        if spec.source == "builtin":
            builtins[spec.name] = spec.builtin
        if spec.gated:
            gated.add(spec.name)
    for i, name in enumerate(raw):
        path = f"replay.live_tools[{i}]"
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            out.append(Problem(path, f"{name!r} is not a tool name"))
        elif name in gated:
            hint = "tools that need approval are answered only from the recording"
            message = f"'{name}' needs approval, so a replay never calls it live"
            out.append(Problem(path, message, hint))
        elif builtins.get(name) in NEVER_LIVE:
            hint = f"{', '.join(NEVER_LIVE)} act outside the replay's run; remove it"
            message = f"'{name}' ({builtins[name]}) can never be called live in a replay"
            out.append(Problem(path, message, hint))


def _check_compare(raw: Any, clean: dict[str, Any], out: list[Problem]) -> None:
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        out.append(Problem("replay.compare", "must map output names to rules", COMPARE_HINT))
        return
    declared = clean.get("outputs") or {}
    for name, rule in raw.items():
        path = f"replay.compare.{name}"
        if name not in declared:
            known = ", ".join(declared) or "none declared"
            out.append(Problem(path, f"'{name}' is not a declared output", f"outputs: {known}"))
        elif isinstance(rule, Mapping):
            tolerance = rule.get("tolerance")
            numeric = isinstance(tolerance, int | float) and not isinstance(tolerance, bool)
            if set(rule) != {"tolerance"} or not numeric or float(tolerance or 0) < 0:
                out.append(Problem(path, "a numeric rule is {tolerance: N} with N >= 0"))
        elif rule not in COMPARE_RULES:
            out.append(Problem(path, f"unknown comparison rule {rule!r}", COMPARE_HINT))


def _check_gate(raw: Any, out: list[Problem]) -> None:
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        hint = "e.g. gate: {runs: 10, max_different: 0}"
        out.append(Problem("replay.gate", "must be a mapping", hint))
        return
    for key, value in raw.items():
        path = f"replay.gate.{key}"
        if key not in GATE_KEYS:
            out.append(Problem(path, f"unknown key '{key}'", f"keys: {', '.join(GATE_KEYS)}"))
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            out.append(Problem(path, "must be a whole number, 0 or more"))
        elif key == "runs" and not 1 <= value <= MAX_GATE_RUNS:
            out.append(Problem(path, f"must be between 1 and {MAX_GATE_RUNS}"))
