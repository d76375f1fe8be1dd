"""An agent worker pinned to E2B: its run_command calls share one E2B sandbox for the whole
run (the real SDK against the stand-in, tests/standins/e2b), files kept between commands and
copied back for the file tools, and the sandbox killed when the run ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine.executor import Executor
from floom.engine.runtime import NodeRuntime
from floom.sandbox.fake import FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.store.models import Run
from tests.standins.e2b import E2BStandin
from tests.support.harness import make_worker, wait_until
from tests.support.rigs.e2b import standin_for_module
from tests.support.rigs.fake_provider import FakeProvider, call, finish

SHELL_YML = """\
name: shell
outputs: {summary: {type: string, required: true}}
sandbox: {backend: e2b}
tools:
  - builtin: read_file
  - builtin: run_command
"""


@pytest.fixture
def e2b_standin() -> Iterator[E2BStandin]:
    with standin_for_module() as standin:
        yield standin


@pytest.fixture
def model(ctx: Context, e2b_standin: E2BStandin, tmp_path: Path) -> Iterator[FakeProvider]:
    ctx.settings.e2b_api_key = e2b_standin.api_key
    provider = FakeProvider()
    NodeRuntime.of(ctx).provider_factory = provider.factory
    folder = make_worker(tmp_path / "shell", SHELL_YML, {"SKILL.md": "Use the shell."})
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive())
    # The node's default backend is the fake: only the pinned worker reaches E2B.
    executor = Executor(ctx, FakeSandbox(), run_agent=run_agent)
    executor.start()
    try:
        yield provider
    finally:
        executor.stop(grace_seconds=2)


def test_an_agents_commands_share_one_e2b_sandbox_killed_when_the_run_ends(
    ctx: Context, model: FakeProvider, e2b_standin: E2BStandin
) -> None:
    model.script(
        call("run_command", {"command": "mkdir -p notes && echo kept > notes/a.txt"}),
        call("run_command", {"command": "cat notes/a.txt"}),
        call("read_file", {"path": "notes/a.txt"}),
        finish({"summary": "done"}),
    )
    run_id = runs.create_run(ctx, caller=SYSTEM, worker_name="shell", inputs={}).id

    def ended() -> Run | None:
        run = runs.get_run(ctx, caller=SYSTEM, run_id=run_id)
        return run if run.finished_at is not None else None

    done: Run = wait_until(ended, timeout=60)
    assert done.status == "succeeded", done.error_message
    second, third = model.requests[2].tool_results, model.requests[3].tool_results
    assert second[0]["content"] == "exit code 0\nkept"
    assert third[0]["content"].strip() == "kept"  # copied back for the file tools
    assert e2b_standin.requests["POST /v2/sandboxes"] == 1
    assert len(e2b_standin.killed) == 1
    assert not e2b_standin.sandboxes
