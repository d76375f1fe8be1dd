"""How a replay differs from the run it replays: outputs (by the worker's comparison rules),
tool calls added, removed and changed, final status, turns, tokens and estimated cost."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from floom.services.replays.recordings import canonical

MAX_LISTED = 50
EXACT = "exact"
ANY_STRING = "any_string"


def output_equal(rule: Any, original: Any, replay: Any) -> bool:
    """One output compared by its rule: "exact" (the default), "any_string" (both are
    non-empty text), or {"tolerance": x} (numbers within x of each other)."""
    if isinstance(rule, Mapping) and "tolerance" in rule:
        numbers = all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in (original, replay)
        )
        if not numbers:
            return False
        try:
            return abs(float(original) - float(replay)) <= float(rule["tolerance"])
        except OverflowError:  # an integer no float holds: equal only exactly
            return bool(original == replay)
    if rule == ANY_STRING:
        return all(isinstance(v, str) and v.strip() for v in (original, replay))
    return canonical(original) == canonical(replay)


def compare_outputs(
    original: Mapping[str, Any] | None,
    replay: Mapping[str, Any] | None,
    rules: Mapping[str, Any],
) -> dict[str, Any]:
    """{"equal": bool, "different": {name: {"original", "replay", "rule"}}}."""
    if original is None or replay is None:
        equal = original is None and replay is None
        return {"equal": equal, "different": {} if equal else {"*": _pair(original, replay)}}
    different = {}
    for name in sorted(set(original) | set(replay)):
        rule = rules.get(name, EXACT)
        if not output_equal(rule, original.get(name), replay.get(name)):
            different[name] = {**_pair(original.get(name), replay.get(name)), "rule": rule}
    return {"equal": not different, "different": different}


def _pair(original: Any, replay: Any) -> dict[str, Any]:
    return {"original": original, "replay": replay}


def _call_view(call: Mapping[str, Any]) -> dict[str, Any]:
    return {"tool": call["tool"], "arguments": call["arguments"], "status": call["status"]}


def compare_tool_calls(
    original: list[Mapping[str, Any]], replay: list[Mapping[str, Any]]
) -> dict[str, Any]:
    """Tool calls added, removed and changed (same tool, other arguments or status), aligned
    as a sequence so a call moved earlier or later is not counted twice."""

    def key(c: Mapping[str, Any]) -> str:
        return f"{c['tool']}\0{canonical(c['arguments'])}\0{c['status']}"

    added: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(
        a=[key(c) for c in original], b=[key(c) for c in replay], autojunk=False
    )
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            continue
        olds, news = list(original[a0:a1]), list(replay[b0:b1])
        while olds and news and olds[0]["tool"] == news[0]["tool"]:
            changed.append({"original": _call_view(olds.pop(0)), "replay": _call_view(news.pop(0))})
        removed.extend(_call_view(c) for c in olds)
        added.extend(_call_view(c) for c in news)
    return {
        "diverged": bool(added or removed or changed),
        "added": added[:MAX_LISTED],
        "removed": removed[:MAX_LISTED],
        "changed": changed[:MAX_LISTED],
        "counts": {"added": len(added), "removed": len(removed), "changed": len(changed)},
    }


def _usage_pair(original: Mapping[str, Any] | None, replay: Mapping[str, Any] | None) -> Any:
    o, r = original or {}, replay or {}

    def pair(name: str) -> dict[str, Any]:
        return {"original": o.get(name, 0), "replay": r.get(name, 0)}

    return {
        "turns": pair("iterations"),
        "tokens": pair("total_tokens"),
        "cost_usd": pair("cost_usd"),
    }


def run_diff(
    original: Mapping[str, Any],
    replay: Mapping[str, Any],
    *,
    rules: Mapping[str, Any],
) -> dict[str, Any]:
    """The diff of two run records (as replay.run_record gives them)."""
    return {
        "status": {"original": original["status"], "replay": replay["status"]},
        "outputs": compare_outputs(original.get("outputs"), replay.get("outputs"), rules),
        # finish's arguments are the outputs, compared above by their rules.
        "tool_calls": compare_tool_calls(_not_finish(original), _not_finish(replay)),
        **_usage_pair(original.get("model_usage"), replay.get("model_usage")),
    }


def _not_finish(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in record["tool_calls"] if c["tool"] != "finish"]


def first_divergence(original: Mapping[str, Any], replay: Mapping[str, Any]) -> Any:
    """Where an exact replay first differs from its original (tool calls by step, then the
    outputs, then the final status), or None: what the loop itself did not already report."""
    pairs = zip(original["tool_calls"], replay["tool_calls"], strict=False)
    for step, (o, r) in enumerate(pairs, start=1):
        # The same comparison as compare_tool_calls, so a report never says "reproduced"
        # beside tool calls that diverged.
        if (o["tool"], canonical(o["arguments"]), o["status"]) != (
            r["tool"],
            canonical(r["arguments"]),
            r["status"],
        ):
            return {
                "step": f"tool call {step}",
                "expected": _call_view(o),
                "actual": _call_view(r),
            }
    calls_o, calls_r = len(original["tool_calls"]), len(replay["tool_calls"])
    if calls_o != calls_r:
        step = min(calls_o, calls_r) + 1
        return {
            "step": f"tool call {step}",
            "expected": _call_view(original["tool_calls"][step - 1]) if calls_o >= step else None,
            "actual": _call_view(replay["tool_calls"][step - 1]) if calls_r >= step else None,
        }
    if json.dumps(original.get("outputs"), sort_keys=True) != json.dumps(
        replay.get("outputs"), sort_keys=True
    ):
        return {"step": "outputs", "expected": original["outputs"], "actual": replay["outputs"]}
    if original["status"] != replay["status"]:
        return {"step": "status", "expected": original["status"], "actual": replay["status"]}
    return None
