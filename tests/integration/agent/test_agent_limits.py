"""Agent limits end runs as limit_exceeded naming the limit; the monthly budget also refuses
new runs until it resets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.anthropic_api import reply, tool_use
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url) as r:
        yield r


def _limited(rig: AgentRig, tmp_path: Path, limits: str, tools: str = "[{builtin: recall}]") -> str:
    rig.deploy(
        agent_worker(tmp_path / "capped", f"name: capped\nlimits: {limits}\ntools: {tools}\n")
    )
    return start_run(rig.api, "capped")


def test_max_tool_iterations_ends_the_run_before_another_model_turn(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.model.script(*[reply(tool_use("recall")) for _ in range(3)])
    run = wait_status(rig.api, _limited(rig, tmp_path, "{max_tool_iterations: 2}"))

    assert run["status"] == "limit_exceeded"
    assert run["error"]["code"] == "limit_exceeded"
    assert "max_tool_iterations" in run["error"]["message"]
    assert len(rig.model.requests) == 2


def test_max_total_tokens_caps_each_request_and_ends_the_run_when_passed(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.model.script(reply(tool_use("recall")), reply(tool_use("recall")))
    run = wait_status(rig.api, _limited(rig, tmp_path, "{max_total_tokens: 150}"))

    assert run["status"] == "limit_exceeded"
    assert "max_total_tokens" in run["error"]["message"]
    assert [r["max_tokens"] for r in rig.model.requests] == [150, 30]
    assert run["model_usage"]["total_tokens"] == 240


def test_timeout_seconds_bounds_the_agent_time_including_its_commands(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.model.script(reply(tool_use("run_command", {"command": "sleep 20"})))
    run = wait_status(
        rig.api,
        _limited(rig, tmp_path, "{timeout_seconds: 1}", "[{builtin: run_command}]"),
    )

    assert run["status"] == "limit_exceeded"
    assert "timeout_seconds" in run["error"]["message"]
    assert "timed out" in run["tool_calls"][0]["error"]


def test_the_monthly_budget_ends_the_run_and_refuses_new_ones_until_it_resets(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.model.script(reply(tool_use("recall"), input_tokens=1000, output_tokens=1000))
    run = wait_status(rig.api, _limited(rig, tmp_path, "{monthly_cost_usd: 0.01}"))

    assert run["status"] == "limit_exceeded"
    assert "monthly_cost_usd" in run["error"]["message"]
    refused = rig.api.post("/api/v1/workers/capped/runs", json={})
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert "monthly_cost_usd" in error["message"]
    assert "resets on" in error["message"]
    assert len(rig.model.requests) == 1
