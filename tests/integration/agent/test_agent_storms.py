"""A model that asks for a storm of tool calls in one turn: past a bound the calls are
refused without running, and a run cancelled (or out of time) mid-turn runs none of the
calls after that point (the in-memory sandbox and the fake model provider, as in
tests/integration/agent/test_agent_loop_fake.py)."""

from __future__ import annotations

from floom.agent.loop import MAX_CALLS_PER_TURN
from floom.sandbox.fake import FakeProcess
from floom.services.access.principal import SYSTEM
from floom.services.runs import lifecycle as runs
from tests.integration.agent.test_agent_loop_fake import Rig, _notes, rig  # noqa: F401  (rig is a fixture)
from tests.support.rigs.fake_provider import finish, reply, tool_use


def test_calls_past_the_bound_of_one_turn_are_refused_unrun_and_the_model_told(
    rig: Rig,  # noqa: F811
) -> None:
    _notes(rig)
    storm = [
        tool_use("write_file", {"path": f"f{i}.txt", "content": "x"})
        for i in range(MAX_CALLS_PER_TURN + 40)
    ]
    rig.model.script(reply(*storm), finish({"summary": "calm"}))
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    written = [c for c in rig.calls(run) if c[0] == "write_file"]
    assert written == [("write_file", "ok", 1)] * MAX_CALLS_PER_TURN
    names = {a.name for a in runs.list_artifacts(rig.ctx, caller=SYSTEM, run_id=run.id)}
    assert names == {f"f{i}.txt" for i in range(MAX_CALLS_PER_TURN)}
    # Every call of the turn is answered (the Messages API needs each one answered), in order.
    results = rig.model.requests[1].tool_results
    assert [r["tool_use_id"] for r in results] == [b["id"] for b in storm]
    refused = results[MAX_CALLS_PER_TURN:]
    assert all(r.get("is_error") for r in refused)
    assert f"at most {MAX_CALLS_PER_TURN} tool calls" in refused[0]["content"]
    assert not any(r.get("is_error") for r in results[:MAX_CALLS_PER_TURN])


def test_a_run_cancelled_during_a_call_runs_none_of_the_later_calls_of_its_turn(
    rig: Rig,  # noqa: F811
) -> None:
    _notes(rig)

    def cancel_then_wait(p: FakeProcess) -> int:
        runs.cancel_run(rig.ctx, run_id=p.spec.run_id, caller=SYSTEM)
        p.sleep(60)  # ended by the cancellation
        return 0

    rig.sandbox.programs["notes"] = cancel_then_wait
    rig.model.script(
        reply(
            tool_use("run_command", {"command": "slow"}),
            tool_use("write_file", {"path": "after.txt", "content": "must not be written"}),
            tool_use("write_file", {"path": "later.txt", "content": "nor this"}),
        ),
        finish({"summary": "never reached"}),
    )
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "cancelled", run.error_message
    assert [c[0] for c in rig.calls(run)] == ["run_command"]
    assert runs.list_artifacts(rig.ctx, caller=SYSTEM, run_id=run.id) == []
    assert len(rig.model.requests) == 1
