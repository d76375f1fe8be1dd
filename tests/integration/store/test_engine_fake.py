"""The engine over the in-memory sandbox: queue, executor, judge and records, no bubblewrap."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine.executor import Executor
from floom.errors import InvalidRequest
from floom.sandbox.base import SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.fake import FakeProcess, FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs.logs import list_events
from floom.services.workers import versions as workers
from tests.support.harness import make_worker, wait_until

MANIFEST = """\
name: adder
entry: run.py
inputs:
  a: {type: integer, required: true}
  b: {type: integer, required: true}
outputs:
  sum: {type: integer}
retries: {count: 1, backoff_seconds: 0}
"""


def _add(p: FakeProcess) -> int:
    inputs = json.loads((p.spec.workdir / "inputs.json").read_text())
    if inputs["a"] < 0:
        p.print("negative input", stream="stderr")
        return 2
    p.print(f"adding {inputs['a']} and {inputs['b']}")
    p.write("result.json", json.dumps({"outputs": {"sum": inputs["a"] + inputs["b"]}}))
    p.write_output("note.txt", "done")
    return 0


@pytest.fixture
def fake() -> FakeSandbox:
    return FakeSandbox({"adder": _add})


@pytest.fixture
def executor(ctx: Context, fake: FakeSandbox, tmp_path: Path) -> Iterator[Executor]:
    folder = make_worker(tmp_path / "adder", MANIFEST, {"run.py": "# run by the fake\n"})
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive())
    engine = Executor(ctx, fake, run_agent=run_agent)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop(grace_seconds=2)


def _finished(ctx: Context, run_id: str) -> object:
    run = runs.get_run(ctx, caller=SYSTEM, run_id=run_id)
    return run if run.finished_at is not None else None


def test_a_run_goes_through_queue_sandbox_and_judge_to_succeeded(
    ctx: Context, executor: Executor, fake: FakeSandbox
) -> None:
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": 2, "b": 3})
    done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
    assert done.status == "succeeded"
    assert json.loads(done.outputs_json) == {"sum": 5}
    assert [a.name for a in runs.list_artifacts(ctx, caller=SYSTEM, run_id=run.id)] == ["note.txt"]
    lines = [e.line for e in list_events(ctx, caller=SYSTEM, run_id=run.id)]
    assert "adding 2 and 3" in lines
    env = fake.specs[-1].env
    assert (env["FLOOM_RUN_ID"], env["FLOOM_WORKER"]) == (run.id, "adder")


def test_a_failing_attempt_is_retried_by_the_manifest_policy_then_fails(
    ctx: Context, executor: Executor, fake: FakeSandbox
) -> None:
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": -1, "b": 3})
    done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
    assert done.status == "failed"
    assert done.attempt == 2
    assert done.error_code == "exit_code"
    assert "negative input" in (done.error_message or "")
    assert len([s for s in fake.specs if s.run_id == run.id]) == 2


def test_a_sandbox_backend_that_fails_under_a_run_ends_it_as_retryable_sandbox_unavailable(
    ctx: Context, executor: Executor, fake: FakeSandbox
) -> None:
    def unavailable(spec: SandboxSpec, **kw: Any) -> SandboxResult:
        fake.specs.append(spec)
        raise SandboxUnavailable("E2B is unreachable", hint="check E2B_DOMAIN")

    fake.run = unavailable  # type: ignore[method-assign]
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": 1, "b": 3})
    done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
    assert (done.status, done.error_code) == ("failed", "sandbox_unavailable")
    assert done.error_message == "E2B is unreachable; check E2B_DOMAIN"
    assert done.attempt == 2  # retried by the worker's policy


def test_a_host_error_under_a_run_is_recorded_with_the_system_s_reason_and_not_the_host_s_path(
    ctx: Context, executor: Executor, fake: FakeSandbox
) -> None:
    def broken_disk(spec: SandboxSpec, **kw: Any) -> SandboxResult:
        raise OSError(errno.EIO, "Input/output error", "/srv/floom/data/runs/x/work/result.json")

    fake.run = broken_disk  # type: ignore[method-assign]
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": 1, "b": 3})
    done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
    assert (done.status, done.error_code) == ("failed", "executor_error")
    assert done.error_message == "floom could not run this attempt: OSError (Input/output error)"


PINNED = MANIFEST.replace("name: adder", "name: pinned") + "sandbox: {backend: e2b}\n"


def test_a_worker_pinned_to_an_unconfigured_backend_is_refused_at_deploy_and_later_fails_naming_it(
    ctx: Context, executor: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    folder = make_worker(tmp_path / "pinned", PINNED, {"run.py": "# run by the fake\n"})
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    with pytest.raises(InvalidRequest) as refused:
        workers.deploy(ctx, caller=SYSTEM, archive=archive)
    assert "FLOOM_E2B_API_KEY" in refused.value.message
    monkeypatch.setattr(ctx.settings, "e2b_api_key", "e2b_configured_then_removed")
    workers.deploy(ctx, caller=SYSTEM, archive=archive)
    monkeypatch.setattr(ctx.settings, "e2b_api_key", "")  # the configuration goes away
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="pinned", inputs={"a": 1, "b": 2})
    done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
    assert (done.status, done.error_code) == ("failed", "sandbox_unavailable")
    assert "FLOOM_E2B_API_KEY" in (done.error_message or "")
    assert done.attempt == 1  # a missing setting is not retried


@contextmanager
def _small_disk(folder: Path, *, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `folder` (made if missing), unmounted after the block."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "floom-test", folder], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", folder], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
@pytest.mark.parametrize("full", ["versions", "runs"])
def test_a_node_whose_disk_is_full_fails_the_attempt_saying_so_and_leaves_nothing_half_written(
    ctx: Context, fake: FakeSandbox, tmp_path: Path, full: str
) -> None:
    # The version's files (about 200 KB) do not fit on a 64 KiB disk: neither their copy
    # unpacked once per node (versions/) nor the run's own copy of them (runs/, the work
    # root). The run fails as the node's trouble (retryable, like a sandbox that cannot
    # start), saying why and what to do, instead of "floom could not run this attempt:
    # OSError"; no partial copy is left to hold the little space there is.
    folder = make_worker(
        tmp_path / "adder", MANIFEST, {"run.py": "# run by the fake\n", "big.txt": "x" * 200_000}
    )
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive())
    data_dir = ctx.settings.data_dir
    with _small_disk(data_dir / full) as disk:
        engine = Executor(ctx, fake, run_agent=run_agent)
        engine.start()
        try:
            run = runs.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": 1, "b": 2})
            done = wait_until(lambda: _finished(ctx, run.id), timeout=20)
            wait_until(lambda: not any(disk.iterdir()))
        finally:
            engine.stop(grace_seconds=2)
    assert (done.status, done.error_code) == ("failed", "sandbox_unavailable")
    assert done.attempt == 2  # retried by its policy (retries.count 1): not the worker's fault
    assert "this node's disk is full" in done.error_message
    assert "No space left on device" in done.error_message
    assert "FLOOM_DATA_DIR" in done.error_message
    assert fake.specs == []


def test_partial_copies_of_a_version_s_files_a_killed_node_left_are_removed_at_its_start(
    ctx: Context, fake: FakeSandbox
) -> None:
    # A node killed while it unpacked a version's files (or whose disk filled meanwhile)
    # left the partial copy under a name no later unpack reuses (the thread's id is in it).
    versions = ctx.settings.data_dir / "versions"
    partial = versions / f"{'a' * 64}.140108241024704.tmp"
    partial.mkdir(parents=True)
    (partial / "run.py").write_text("# half")
    kept = versions / ("b" * 64)
    kept.mkdir()
    engine = Executor(ctx, fake, run_agent=run_agent)
    engine.start()
    engine.stop(grace_seconds=2)
    assert sorted(p.name for p in versions.iterdir()) == [kept.name]
