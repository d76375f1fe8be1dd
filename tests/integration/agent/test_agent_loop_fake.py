"""The agent loop end to end on the in-memory sandbox and the fake model provider: the queue,
the executor, the runner and the loop are real; no bubblewrap, no HTTP.

What the loop does with the model's replies is tested here; that the real SDK speaks the
Messages API is tested through the stand-in (tests/integration/agent/test_agent_loop.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from floom.agent.provider import AnthropicProvider, build_provider, estimate_cost
from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.config import Settings
from floom.engine.executor import Executor
from floom.engine.runtime import NodeRuntime
from floom.errors import ProviderAuthFailed, ProviderError, ProviderKeyMissing
from floom.sandbox.fake import FakeProcess, FakeSandbox
from floom.schemas.runs import ModelUsage, RunPublic
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs import records as run_records
from floom.services.runs.logs import list_events
from floom.services.workers import versions as workers
from floom.store.models import Run
from tests.support.harness import make_worker, wait_until
from tests.support.rigs.fake_provider import FakeProvider, call, finish, reply, text, tool_use

NOTES_YML = """\
name: notes
inputs: {topic: {type: string, required: true}}
outputs:
  summary: {type: string, required: true}
  count: integer
tools:
  - builtin: read_file
  - builtin: list_files
  - builtin: write_file
  - builtin: run_command
"""


def _sandboxed_echo(p: FakeProcess) -> int:
    p.print(f"ran {p.spec.command[-1]!r} in the sandbox")
    return 0


@dataclass
class Rig:
    ctx: Context
    model: FakeProvider
    sandbox: FakeSandbox
    tmp: Path

    def deploy(self, manifest: str, skill: str = "Do the task.", **files: str) -> None:
        name = manifest.split("\n", 1)[0].removeprefix("name:").strip()
        folder = make_worker(self.tmp / name, manifest, {"SKILL.md": skill, **files})
        workers.deploy(
            self.ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive()
        )

    def run(self, worker: str, inputs: dict[str, Any] | None = None) -> Run:
        """Start a run of `worker` and wait for its end."""
        run_id = runs.create_run(
            self.ctx, caller=SYSTEM, worker_name=worker, inputs=inputs or {}
        ).id

        def ended() -> Run | None:
            run = runs.get_run(self.ctx, caller=SYSTEM, run_id=run_id)
            return run if run.finished_at is not None else None

        done: Run = wait_until(ended, timeout=20)
        return done

    def calls(self, run: Run) -> list[tuple[str, str, int]]:
        return [
            (c.tool, c.status, c.attempt)
            for c in agent_runs.list_tool_calls(self.ctx, caller=SYSTEM, run_id=run.id)
        ]


@pytest.fixture
def rig(ctx: Context, tmp_path: Path) -> Iterator[Rig]:
    model = FakeProvider()
    NodeRuntime.of(ctx).provider_factory = model.factory
    sandbox = FakeSandbox({"notes": _sandboxed_echo})
    executor = Executor(ctx, sandbox, run_agent=run_agent)
    executor.start()
    try:
        yield Rig(ctx=ctx, model=model, sandbox=sandbox, tmp=tmp_path)
    finally:
        executor.stop(grace_seconds=2)


def _notes(rig: Rig) -> None:
    rig.deploy(
        NOTES_YML,
        "Summarise the facts about the topic.",
        **{"data/facts.txt": "fact one\nfact two\n"},
    )


def test_the_loop_runs_tools_in_the_order_the_model_asks_and_records_every_call(
    rig: Rig,
) -> None:
    _notes(rig)
    read = tool_use("read_file", {"path": "data/facts.txt"})
    command = tool_use("run_command", {"command": "wc -l data/facts.txt"})
    rig.model.script(
        reply("Looking around.", tool_use("list_files")),
        reply(read, command),
        call("write_file", {"path": "summary.md", "content": "# Two facts"}),
        finish({"summary": "two facts", "count": 2}),
    )
    run = rig.run("notes", {"topic": "facts"})

    assert (run.status, run.error_code) == ("succeeded", None), run.error_message
    assert json.loads(run.outputs_json or "null") == {"summary": "two facts", "count": 2}
    assert [a.name for a in runs.list_artifacts(rig.ctx, caller=SYSTEM, run_id=run.id)] == [
        "summary.md"
    ]
    assert rig.calls(run) == [
        ("list_files", "ok", 1),
        ("read_file", "ok", 1),
        ("run_command", "ok", 1),
        ("write_file", "ok", 1),
        ("finish", "ok", 1),
    ]
    first, second, third, _ = rig.model.requests
    assert first.tool_names == ["read_file", "list_files", "write_file", "run_command", "finish"]
    assert first.model == rig.ctx.settings.model
    assert "Summarise the facts" in first.system
    assert '"topic": "facts"' in first.messages[0]["content"]
    assert "data/facts.txt" in second.tool_results[0]["content"]
    # Both calls of one turn answered in one user turn, in the order they were asked for.
    assert [r["tool_use_id"] for r in third.tool_results] == [read["id"], command["id"]]
    assert "fact one" in third.tool_results[0]["content"]
    assert (
        third.tool_results[1]["content"] == "exit code 0\nran 'wc -l data/facts.txt' in the sandbox"
    )
    assert rig.sandbox.specs[-1].command == ["bash", "-c", "wc -l data/facts.txt"]
    assert not any(r.get("is_error") for q in rig.model.requests for r in q.tool_results)
    assert rig.model.built_with == [rig.ctx.settings]
    lines = [e.line for e in list_events(rig.ctx, caller=SYSTEM, run_id=run.id)]
    assert "agent: Looking around." in lines


def test_an_agent_runs_all_its_commands_in_one_sandbox_session_closed_when_the_run_ends(
    rig: Rig,
) -> None:
    _notes(rig)
    rig.model.script(
        call("run_command", {"command": "pip install --user tool"}),
        call("run_command", {"command": "tool data/facts.txt"}),
        finish({"summary": "done"}),
    )
    run = rig.run("notes", {"topic": "facts"})

    assert run.status == "succeeded", run.error_message
    (session,) = rig.sandbox.sessions
    assert session.commands == 2
    assert session.guard.closed


def test_a_failed_tool_call_goes_back_to_the_model_as_an_error_result(rig: Rig) -> None:
    _notes(rig)

    def quote_the_error(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        (result,) = messages[-1]["content"]
        return finish({"summary": result["content"]})

    rig.model.script(call("read_file", {"path": "missing.txt"}), quote_the_error)
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    (result,) = rig.model.requests[1].tool_results
    assert result["is_error"] is True
    assert "missing.txt" in result["content"]
    failed = agent_runs.list_tool_calls(rig.ctx, caller=SYSTEM, run_id=run.id)[0]
    assert (failed.tool, failed.status, failed.error) == ("read_file", "error", result["content"])
    assert json.loads(run.outputs_json or "null") == {"summary": result["content"]}


def test_finish_outputs_are_checked_against_the_manifest_and_the_model_is_told_why(
    rig: Rig,
) -> None:
    _notes(rig)
    rig.model.script(
        call("finish", {"summary": "not wrapped in outputs"}),
        finish({"count": "two"}),
        finish({"summary": "two facts", "count": 2}),
    )
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    assert json.loads(run.outputs_json or "null") == {"summary": "two facts", "count": 2}
    assert rig.calls(run) == [("finish", "error", 1), ("finish", "error", 1), ("finish", "ok", 1)]
    (unwrapped,) = rig.model.requests[1].tool_results
    assert unwrapped["is_error"] is True
    assert 'finish needs {"outputs": {...}}' in unwrapped["content"]
    (mismatch,) = rig.model.requests[2].tool_results
    assert mismatch["is_error"] is True
    assert "outputs.summary" in mismatch["content"]
    assert "outputs.count" in mismatch["content"]


def test_max_tool_iterations_ends_the_run_as_limit_exceeded_before_another_model_turn(
    rig: Rig,
) -> None:
    rig.deploy("name: capped\nlimits: {max_tool_iterations: 2}\ntools: [{builtin: recall}]\n")
    rig.model.script(*[call("recall", {"key": "k"}) for _ in range(3)])
    run = rig.run("capped")

    assert (run.status, run.error_code) == ("limit_exceeded", "limit_exceeded")
    assert run.error_message == (
        "limit max_tool_iterations reached: 2 model turns "
        "(limits.max_tool_iterations in worker.yml)"
    )
    assert len(rig.model.requests) == 2
    assert rig.model.remaining == 1
    # The last turn's call was answered before the limit stopped the next turn.
    assert rig.calls(run) == [("recall", "ok", 1), ("recall", "ok", 1)]
    assert run.attempt == 1


STEADY_YML = """\
name: steady
retries: {{count: {retries}, backoff_seconds: 0}}
tools: [{{builtin: write_file}}, {{builtin: read_file}}]
"""


def test_a_retryable_provider_error_ends_the_attempt_and_the_next_resumes_without_redoing_calls(
    rig: Rig,
) -> None:
    rig.deploy(STEADY_YML.format(retries=1))
    rig.model.script(
        call("write_file", {"path": "draft.md", "content": "kept"}),
        ProviderError("overloaded", retryable=True),
        finish({}),
    )
    run = rig.run("steady")

    assert (run.status, run.attempt) == ("succeeded", 2), run.error_message
    assert rig.calls(run) == [("write_file", "ok", 1), ("finish", "ok", 2)]
    failed, resumed = rig.model.requests[1:]
    assert resumed.messages == failed.messages


def test_a_retryable_provider_error_fails_the_run_once_no_attempt_is_left(rig: Rig) -> None:
    rig.deploy(STEADY_YML.format(retries=1))
    rig.model.script(
        ProviderError("overloaded", retryable=True),
        ProviderError("still overloaded", retryable=True),
    )
    run = rig.run("steady")

    assert (run.status, run.attempt) == ("failed", 2)
    assert (run.error_code, run.error_message) == ("model_error", "still overloaded")
    assert len(rig.model.requests) == 2


@pytest.mark.parametrize(
    "error",
    [ProviderError("bad request", retryable=False), ProviderAuthFailed("the key was refused")],
    ids=["model_error", "provider_auth"],
)
def test_a_non_retryable_provider_error_fails_the_run_at_once_despite_retries_left(
    rig: Rig, error: ProviderError
) -> None:
    rig.deploy(STEADY_YML.format(retries=3))
    rig.model.script(error, finish({}))
    run = rig.run("steady")

    assert (run.status, run.attempt) == ("failed", 1)
    assert (run.error_code, run.error_message) == (error.code, error.message)
    assert len(rig.model.requests) == 1


def test_a_provider_error_after_the_runs_time_is_up_is_the_timeout_limit(rig: Rig) -> None:
    rig.deploy(
        "name: slow\nlimits: {timeout_seconds: 1}\nretries: {count: 2, backoff_seconds: 0}\n"
    )

    def slow_then_failing(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        # A provider that gives up only after the run's whole time has gone.
        time.sleep(1.1)
        raise ProviderError("timed out", retryable=True)

    rig.model.script(slow_then_failing)
    run = rig.run("slow")

    assert (run.status, run.error_code, run.attempt) == ("limit_exceeded", "limit_exceeded", 1)
    assert "limit timeout_seconds reached: 1s of agent time" in (run.error_message or "")


def test_token_usage_and_its_estimated_cost_are_recorded_per_run(rig: Rig) -> None:
    rig.deploy("name: priced\nmodel: claude-haiku-4-5\ntools: [{builtin: list_files}]\n")
    rig.model.script(
        call("list_files", input_tokens=1200, output_tokens=300),
        finish({}, input_tokens=1500, output_tokens=50),
    )
    run = rig.run("priced")

    assert run.status == "succeeded", run.error_message
    assert [r.model for r in rig.model.requests] == ["claude-haiku-4-5"] * 2
    transcript = run_records.run_extras(rig.ctx, caller=SYSTEM, run=run).transcript
    assert transcript is not None
    usage = ModelUsage.of(transcript).model_dump()
    assert usage == {
        "model": "claude-haiku-4-5",
        "iterations": 2,
        "input_tokens": 2700,
        "output_tokens": 350,
        "total_tokens": 3050,
        "cost_usd": round(estimate_cost("claude-haiku-4-5", 2700, 350), 6),
    }
    assert usage["cost_usd"] == pytest.approx((2700 * 1.0 + 350 * 5.0) / 1e6)
    lines = [e.line for e in list_events(rig.ctx, caller=SYSTEM, run_id=run.id)]
    assert "model turn 1: 1200 in + 300 out tokens" in lines
    assert "model turn 2: 1500 in + 50 out tokens" in lines


# Moved here from tests/integration/agent/test_agent_loop.py: they test the loop, not the SDK.


def test_a_tool_outside_the_allowlist_is_never_shown_and_a_call_to_it_is_refused(
    rig: Rig,
) -> None:
    _notes(rig)
    rig.model.script(
        call("http_request", {"url": "http://example.test/"}), finish({"summary": "done"})
    )
    run = rig.run("notes", {"topic": "x"})

    assert run.status == "succeeded", run.error_message
    assert "http_request" not in rig.model.requests[0].tool_names
    refused = agent_runs.list_tool_calls(rig.ctx, caller=SYSTEM, run_id=run.id)[0]
    assert (refused.tool, refused.status) == ("http_request", "refused")
    assert "no tool 'http_request'" in (refused.error or "")
    assert rig.model.requests[1].tool_results[0]["is_error"] is True


def test_an_agent_that_keeps_talking_without_finishing_is_nudged_then_failed(rig: Rig) -> None:
    rig.deploy("name: chatty\n")
    rig.model.script(reply(text("Hello!")), reply("Still here."), reply("Bye."))
    run = rig.run("chatty")

    assert (run.status, run.error_code) == ("failed", "agent_error")
    assert len(rig.model.requests) == 3
    nudge = rig.model.requests[1].messages[-1]
    assert nudge["role"] == "user"
    assert "finish" in nudge["content"]


def test_a_missing_provider_key_fails_the_run_at_start_naming_the_setting(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # The configured provider, which has no key here.
    NodeRuntime.of(rig.ctx).provider_factory = None
    rig.deploy("name: idle\nretries: {count: 2, backoff_seconds: 0}\n")
    run = rig.run("idle")

    assert (run.status, run.error_code, run.attempt) == ("failed", "provider_key_missing", 1)
    assert "FLOOM_ANTHROPIC_API_KEY" in (run.error_message or "")
    assert rig.model.requests == []


def test_build_provider_refuses_without_a_key_and_builds_the_messages_client_with_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderKeyMissing) as refused:
        build_provider(Settings(data_dir=tmp_path, anthropic_api_key=""))
    assert refused.value.code == "provider_key_missing"
    assert refused.value.retryable is False
    assert "FLOOM_ANTHROPIC_API_KEY" in refused.value.message
    provider = build_provider(Settings(data_dir=tmp_path, anthropic_api_key="sk-test"))
    assert isinstance(provider, AnthropicProvider)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_agent_run_interrupted_by_a_node_shutdown_resumes_on_the_next_node_as_told(
    ctx: Context, tmp_path: Path
) -> None:
    # What README's "Stopping a node" says holds for agent runs too: interrupted, requeued as
    # the next attempt at no cost of a retry, and resumed without redoing the calls made.
    model = FakeProvider()
    NodeRuntime.of(ctx).provider_factory = model.factory
    started = threading.Event()

    def long_command(p: FakeProcess) -> int:
        if p.spec.command[-1] == "long":
            started.set()
            p.sleep(120)  # ended by the interruption
        return 0

    sandbox = FakeSandbox({"long": long_command, "quick": long_command})
    rig = Rig(ctx=ctx, model=model, sandbox=sandbox, tmp=tmp_path)
    rig.deploy("name: busy\ntools: [{builtin: write_file}, {builtin: run_command}]\n")
    model.script(
        call("write_file", {"path": "draft.md", "content": "kept"}),
        call("run_command", {"command": "long"}),
        call("run_command", {"command": "quick"}),
        finish({}),
    )
    first = Executor(ctx, sandbox, run_agent=run_agent)
    first.start()
    run_id = runs.create_run(ctx, caller=SYSTEM, worker_name="busy", inputs={}).id
    assert started.wait(20)
    first.stop(grace_seconds=0)  # the drain is over: what still runs is interrupted

    between = runs.get_run(ctx, caller=SYSTEM, run_id=run_id)
    assert (between.status, between.attempt, between.max_attempts) == ("queued", 2, 2)
    assert RunPublic.of(between).previous_attempt == "interrupted"
    second = Executor(ctx, sandbox, run_agent=run_agent)
    second.start()
    try:
        done = wait_until(
            lambda: (
                (r := runs.get_run(ctx, caller=SYSTEM, run_id=run_id)).finished_at is not None and r
            ),
            timeout=20,
        )
    finally:
        second.stop(grace_seconds=2)

    assert (done.status, done.attempt) == ("succeeded", 2), done.error_message
    assert RunPublic.of(done).previous_attempt == "interrupted"
    # The call made before is not made again; the one cut short is recorded as such, and the
    # model, told so, decides what to do next on the new attempt.
    assert rig.calls(done) == [
        ("write_file", "ok", 1),
        ("run_command", "error", 1),
        ("run_command", "ok", 2),
        ("finish", "ok", 2),
    ]
    notices = [
        e.line for e in list_events(ctx, caller=SYSTEM, run_id=run_id) if e.stream == "system"
    ]
    assert any("interrupted by node shutdown; requeued" in line for line in notices), notices
