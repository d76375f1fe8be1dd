"""An agent's tool input over floom's JSON bounds is refused before anything walks or stores
it: the model is told which bound, the call is recorded as refused with a marker, and the
run goes on (the in-memory sandbox and the fake model provider, as in
tests/integration/agent/test_agent_loop_fake.py)."""

from __future__ import annotations

import json
from typing import Any

from floom import jsonvalues
from floom.services.access.principal import SYSTEM
from floom.services.runs import agent as agent_runs
from floom.store.agents import Transcript
from tests.integration.agent.test_agent_loop_fake import Rig, _notes, rig  # noqa: F401  (rig is a fixture)
from tests.support.rigs.fake_provider import call, finish


def _nested(levels: int) -> Any:
    value: Any = "deep"
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_tool_input_over_a_bound_is_refused_and_the_model_is_told_which(rig: Rig) -> None:  # noqa: F811
    _notes(rig)
    rig.model.script(
        call("finish", {"outputs": {"summary": _nested(900)}}),
        call("write_file", {"path": "x.txt", "content": "y", "extra": float("nan")}),
        finish({"summary": "flat at last"}),
    )
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    assert json.loads(run.outputs_json or "null") == {"summary": "flat at last"}
    deep, nan = rig.model.requests[1].tool_results[0], rig.model.requests[2].tool_results[0]
    assert deep["is_error"]
    assert "(depth bound)" in deep["content"]
    assert nan["is_error"]
    assert "(number bound)" in nan["content"]
    calls = agent_runs.list_tool_calls(rig.ctx, caller=SYSTEM, run_id=run.id)
    assert [(c.tool, c.status) for c in calls][:2] == [
        ("finish", "refused"),
        ("write_file", "refused"),
    ]
    assert "floom_unreadable" in calls[0].arguments_json
    with rig.ctx.engine.connect() as conn:
        stored = conn.execute(
            Transcript.__table__.select().where(Transcript.__table__.c.run_id == run.id)  # type: ignore[attr-defined]
        ).one()
    # The transcript keeps the marker in place of the input, and so stays readable whole.
    assert "floom_unreadable" in stored.messages_json
    assert isinstance(jsonvalues.stored(stored.messages_json, expect=list)[0], dict)
    assert jsonvalues.stored(stored.messages_json, expect=list)[0].get("role") == "user"


def test_a_timeout_that_is_no_number_is_told_to_the_model_not_an_internal_error(rig: Rig) -> None:  # noqa: F811
    _notes(rig)
    rig.model.script(
        call("run_command", {"command": "true", "timeout_seconds": "soon"}),
        call("run_command", {"command": "true", "timeout_seconds": 10**400}),
        call("run_command", {"command": "true", "timeout_seconds": [5]}),
        finish({"summary": "done"}),
    )
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    for request in rig.model.requests[1:4]:
        (result,) = request.tool_results
        assert result["is_error"]
        assert "'timeout_seconds' must be a number of seconds" in result["content"]
    assert rig.sandbox.specs == []
