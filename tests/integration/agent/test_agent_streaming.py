"""Live agent progress: the model's streamed text and tool calls reach the run's ordered log
while the model turn is still arriving (the real anthropic SDK against the stand-in)."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.standins.anthropic_api import reply, text, tool_use
from tests.support.harness import wait_until
from tests.support.rigs.agents import agent_rig, agent_worker, log_lines, start_run, wait_status


def test_a_runs_log_shows_the_agents_text_and_tool_calls_as_the_model_streams_them(
    tmp_path: Path,
) -> None:
    hold = threading.Event()
    with agent_rig(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}") as rig:
        rig.deploy(agent_worker(tmp_path / "thinker", "name: thinker\n"))
        rig.model.script(
            reply(
                text("Reading the inputs.\nNothing to do: finishing."),
                tool_use("finish", {"outputs": {}}),
                hold=hold,
            )
        )
        run_id = start_run(rig.api, "thinker")
        try:
            # Mid-turn: the text is in the log, the turn itself is not over.
            seen = wait_until(
                lambda: (
                    (lines := log_lines(rig.api, run_id))
                    and "agent: Nothing to do: finishing." in lines
                    and lines
                ),
                timeout=60,
            )
            assert "agent: Reading the inputs." in seen
            assert not any(line.startswith("model turn 1") for line in seen)
            assert rig.api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
        finally:
            hold.set()
        run = wait_status(rig.api, run_id, timeout=90)
        lines = log_lines(rig.api, run_id)

    assert run["status"] == "succeeded", run
    order = [
        "agent: Reading the inputs.",
        "agent: Nothing to do: finishing.",
        "agent calls finish",
    ]
    at = [lines.index(line) for line in order]
    assert at == sorted(at)
    assert at[-1] < next(i for i, line in enumerate(lines) if line.startswith("model turn 1"))
    assert lines.count("agent: Reading the inputs.") == 1  # not logged again after the turn
    assert rig.model.requests[0].get("stream") is True
