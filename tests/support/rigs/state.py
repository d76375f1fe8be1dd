"""A worker with state for the worker state tests: it counts its successful runs in its state
and says what state it started from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.harness import deploy_folder, make_worker, wait_for_run
from tests.support.rigs.agents import start_run

COUNTER_YML = """\
name: counter
state: true
inputs:
  fail: {type: boolean, default: false}
  big: {type: integer, default: 0}
outputs:
  seen: {type: object}
"""

# Counts its successful runs in its state; `fail` leaves a new state and then fails, `big`
# leaves a state of that many characters.
COUNTER_PY = """\
import json, os
inputs = json.load(open("inputs.json"))
seen = json.load(open("state.json"))
state = {"count": (seen or {}).get("count", 0) + 1, "run": os.environ["FLOOM_RUN_ID"]}
if inputs["big"]:
    state["pad"] = "x" * inputs["big"]
result = {"outputs": {"seen": {"state": seen}}, "state": state}
if inputs["fail"]:
    result["error"] = "failing on purpose"
    result["retryable"] = False
json.dump(result, open("result.json", "w"))
"""


def deploy_counter(
    api: httpx.Client, tmp_path: Path, manifest: str = COUNTER_YML, py: str = COUNTER_PY
) -> None:
    deploy_folder(api, make_worker(tmp_path / "counter", manifest, {"run.py": py}))


def run_counter(api: httpx.Client, **inputs: Any) -> dict[str, Any]:
    return wait_for_run(api, start_run(api, "counter", inputs))


def counter_state(api: httpx.Client) -> dict[str, Any]:
    resp = api.get("/api/v1/workers/counter/state")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body
