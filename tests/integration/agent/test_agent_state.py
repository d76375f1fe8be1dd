"""An agent worker's state: the read_state tool, and a new state left with finish."""

from __future__ import annotations

import json
from pathlib import Path

from tests.standins.anthropic_api import reply, tool_use
from tests.support.rigs.agents import agent_rig, agent_worker, start_run, wait_status


def test_an_agent_reads_its_state_with_a_tool_and_leaves_the_next_with_finish(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as rig:
        rig.deploy(agent_worker(tmp_path / "keeper", "name: keeper\nstate: {max_bytes: 100}\n"))
        rig.model.script(
            reply(tool_use("read_state")),
            reply(tool_use("finish", {"outputs": {}, "state": {"n": 1}})),
        )
        first = wait_status(rig.api, start_run(rig.api, "keeper"))
        rig.model.script(
            reply(tool_use("read_state")),
            reply(tool_use("finish", {"outputs": {}, "state": {"pad": "x" * 200}})),
            reply(tool_use("finish", {"outputs": {}, "state": {"n": 2}})),
        )
        second = wait_status(rig.api, start_run(rig.api, "keeper"))
        assert "read_state" in rig.model.tool_names(0)
        finish_schema = next(t for t in rig.model.requests[0]["tools"] if t["name"] == "finish")[
            "input_schema"
        ]
        state = rig.api.get("/api/v1/workers/keeper/state").json()

    assert first["status"] == second["status"] == "succeeded", (first, second)
    assert "state" in finish_schema["properties"]
    assert json.loads(first["tool_calls"][0]["result"]) == {"version": 0, "state": None}
    assert json.loads(second["tool_calls"][0]["result"]) == {"version": 1, "state": {"n": 1}}
    refused = second["tool_calls"][1]
    assert refused["status"] == "error"
    assert "at most 100" in refused["error"]
    assert state["current_version"] == 2
    assert state["state"] == {"n": 2}
    assert state["written"]["run_id"] == second["id"]
