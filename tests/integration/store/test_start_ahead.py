"""A run's sandbox started ahead while the run is being queued: bubblewrap makes the sandbox
and waits; the command runs only once the run is committed as this node's, and a run that is
not (refused, queued behind others) ends its sandbox without the command ever running."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from floom.agent.runner import run_agent
from floom.bundle import read_folder
from floom.engine.dispatch import StartedAttempt
from floom.engine.executor import Executor
from floom.engine.queue import claim_next
from floom.errors import WorkerPaused
from floom.sandbox import LocalSandbox
from floom.sandbox.base import SandboxSpec, SandboxUnavailable
from floom.sandbox.local import backend as local_module
from floom.sandbox.local.disks import DISKS_DIR
from floom.sandbox.local.supervisor import Supervisor
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, Worker, new_id, trusted_row
from tests.support.harness import make_worker, wait_until
from tests.support.rigs.queues import enqueue

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)

# Leaves a mark in the output dir (a host path) the moment it runs.
MARKING = "open('/output/ran', 'w').write('yes'); print('ran')"


def _spec(tmp_path: Path, script: str = MARKING) -> SandboxSpec:
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text(script)
    return SandboxSpec(
        run_id=f"run-test-{uuid.uuid4().hex[:8]}",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        timeout_seconds=30.0,
    )


def _launcher_of(ahead: Any) -> Any:
    started = ahead._started
    assert started is not None
    return started[0]


def test_a_sandbox_started_ahead_runs_its_command_only_once_released(tmp_path: Path) -> None:
    sandbox = LocalSandbox()
    try:
        spec = _spec(tmp_path)
        ahead = sandbox.start_ahead(spec)
        launcher = _launcher_of(ahead)
        # bubblewrap has made the sandbox, and its pid 1 is blocked reading the release fd:
        # the command cannot have started, and does not until it is released.
        wait_until(lambda: _waiting_for_release(launcher), timeout=10)
        assert not (spec.output_dir / "ran").exists()
        assert launcher.proc.poll() is None

        lines: list[tuple[str, str]] = []
        result = ahead.run(on_line=lambda s, line: lines.append((s, line)), should_cancel=bool)

        assert (result.exit_code, result.error) == (0, None)
        assert ("stdout", "ran") in lines
        assert (spec.output_dir / "ran").read_text() == "yes"
        ahead.discard()  # after its run: nothing left to end
        with pytest.raises(SandboxUnavailable):
            ahead.run(on_line=lambda s, line: None, should_cancel=bool)
    finally:
        sandbox.close()


def test_a_discarded_sandbox_is_killed_before_its_command_could_run_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bubblewrap runs the command on end-of-file of its block fd as on a byte: closing the
    # fd before the tree is killed would let the command start.
    sandbox = LocalSandbox()
    release_open_at_kill: list[bool] = []
    real_kill = Supervisor.kill_tree

    def kill_tree(self: Supervisor) -> bool:
        release_open_at_kill.append(_pipe_of(launcher.release_fd) == release_pipe)
        return real_kill(self)

    monkeypatch.setattr(Supervisor, "kill_tree", kill_tree)
    try:
        spec = _spec(tmp_path)
        ahead = sandbox.start_ahead(spec)
        launcher = _launcher_of(ahead)
        cgroup = launcher.cgroup
        release_pipe = _pipe_of(launcher.release_fd)
        wait_until(lambda: _waiting_for_release(launcher), timeout=10)

        ahead.discard()

        assert release_open_at_kill
        assert release_open_at_kill[0]
        assert launcher.proc.poll() is not None
        if cgroup is not None:
            assert not any(Path(d).exists() for d in cgroup.dirs.values())
        # The whole tree is gone (bwrap reaped, the cgroup removed): nothing can write later.
        assert not (spec.output_dir / "ran").exists()
        with pytest.raises(SandboxUnavailable):
            ahead.run(on_line=lambda s, line: None, should_cancel=bool)
        ahead.discard()  # twice: nothing more
    finally:
        sandbox.close()


def _deploy(ctx: Context, tmp_path: Path, name: str, script: str) -> None:
    folder = make_worker(tmp_path / name, f"name: {name}\n", {"run.py": script})
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    workers.deploy(ctx, caller=SYSTEM, archive=archive)


def test_a_run_refused_in_its_queueing_transaction_ends_its_started_sandbox(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _deploy(ctx, tmp_path, "w1", MARKING)
    sandbox = LocalSandbox()
    engine = Executor(ctx, sandbox, run_agent=run_agent)
    engine.start()
    abandoned: list[str] = []
    real_abandon = local_module.LocalSandbox._abandon

    def abandon(self: LocalSandbox, spec: Any, launcher: Any, *started: Any) -> None:
        abandoned.append(str(launcher.proc.pid))
        real_abandon(self, spec, launcher, *started)

    monkeypatch.setattr(local_module.LocalSandbox, "_abandon", abandon)
    try:
        runs.create_run(ctx, worker_name="w1", caller=SYSTEM)  # this process caches w1
        # Paused behind this process's back: the copy it checks first says it is not, so
        # the run's sandbox starts ahead; the queueing transaction then finds it paused.
        with session_scope(ctx.engine, write=True) as s:
            worker = s.get(Worker, "w1")
            assert worker is not None
            worker.paused = True
            s.add(worker)
        wait_until(lambda: engine.active_count() == 0, timeout=30)

        with pytest.raises(WorkerPaused):
            runs.create_run(ctx, worker_name="w1", caller=SYSTEM)

        assert len(abandoned) == 1
        assert not engine.dispatch.ahead
        assert engine.active_count() == 0
        assert engine.dispatch.taken() == 0
        # Its work dir goes too (in the background, as every run's), its disk unmounted.
        wait_until(lambda: not _run_dirs_left(ctx.settings.work_root), timeout=10)
    finally:
        engine.stop()


def test_a_refused_run_lets_go_of_its_run_dir_started_ahead_though_ending_its_sandbox_failed(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refusal reaches the caller, and the run dir (a disk of its own on a root floom)
    # is unmounted and removed, whatever ending the sandbox started ahead met.
    _deploy(ctx, tmp_path, "w1", MARKING)
    sandbox = LocalSandbox()
    engine = Executor(ctx, sandbox, run_agent=run_agent)
    engine.start()
    real_abandon = local_module.LocalSandbox._abandon

    def abandon(self: LocalSandbox, *started: Any) -> None:
        real_abandon(self, *started)
        raise OSError("ending the sandbox failed")

    monkeypatch.setattr(local_module.LocalSandbox, "_abandon", abandon)
    try:
        runs.create_run(ctx, worker_name="w1", caller=SYSTEM)  # this process caches w1
        with session_scope(ctx.engine, write=True) as s:
            worker = s.get(Worker, "w1")
            assert worker is not None
            worker.paused = True
            s.add(worker)
        wait_until(lambda: engine.active_count() == 0, timeout=30)

        with pytest.raises(WorkerPaused):
            runs.create_run(ctx, worker_name="w1", caller=SYSTEM)

        assert not engine.dispatch.ahead
        assert engine.active_count() == 0
        assert engine.dispatch.taken() == 0
        wait_until(lambda: not _run_dirs_left(ctx.settings.work_root), timeout=10)
    finally:
        engine.stop()


def _run_dirs_left(work_root: Path) -> list[str]:
    """The run dirs (and mounts) left under `work_root`: not the disks kept ready for the
    next runs (floom/sandbox/local/disks.py), whose images live there."""
    left = [p.name for p in work_root.iterdir() if p.name != DISKS_DIR]
    top = f"{os.path.realpath(work_root)}/"
    with open("/proc/self/mountinfo") as table:
        left += [line.split(" ")[4] for line in table if line.split(" ")[4].startswith(top)]
    return left


def test_a_run_queued_behind_an_older_one_runs_later_while_its_early_start_is_discarded(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run is committed as queued (an older run is runnable), so its sandbox started
    # ahead is discarded; a claim of the run may meanwhile prepare and run it on this node.
    _deploy(ctx, tmp_path, "w1", MARKING)
    engine = Executor(ctx, LocalSandbox(), run_agent=run_agent)
    engine.runtime.dispatch = engine.dispatch  # as its start would, without its loops
    (older,) = enqueue(ctx, 1)
    statuses: list[str] = []
    real_discard = StartedAttempt.discard

    def claimed_meanwhile(self: StartedAttempt) -> None:
        claimed = [claim_next(ctx).run for _ in range(2)]
        assert next(r.id for r in claimed if r is not None) == older
        (mine,) = [r for r in claimed if r is not None and r.id == self.attempt.run.id]
        engine.run_claimed_inline(mine)
        statuses.append(runs.get_run(ctx, run_id=mine.id, caller=SYSTEM).status)
        real_discard(self)

    monkeypatch.setattr(StartedAttempt, "discard", claimed_meanwhile)
    try:
        run = runs.create_run(ctx, worker_name="w1", caller=SYSTEM)

        assert run.status == "queued"
        assert statuses == ["succeeded"]
        assert engine.dispatch.taken() == 0
        assert not engine.dispatch.ahead
    finally:
        engine.runtime.dispatch = None
        engine.sandbox.close()


def test_the_reaper_leaves_a_sandbox_started_ahead_alone(ctx: Context, tmp_path: Path) -> None:
    _deploy(ctx, tmp_path, "w1", MARKING)
    engine = Executor(ctx, LocalSandbox(), run_agent=run_agent)
    engine.start()
    try:
        worker = workers.get_worker(ctx, name="w1", caller=SYSTEM)
        assert worker.active_version_id is not None
        version = workers.get_version(ctx, version_id=worker.active_version_id, caller=SYSTEM)
        run = trusted_row(
            Run,
            {
                "id": new_id("run"),
                "worker_name": "w1",
                "version_id": version.id,
                "status": "queued",
                "trigger": "api",
                "inputs_json": "{}",
            },
        )
        assert engine.dispatch.reserve()
        ahead = engine.dispatch.start_ahead(run, version)
        assert ahead is not None
        launcher = _launcher_of(ahead._sandbox)
        wait_until(lambda: _waiting_for_release(launcher), timeout=10)

        assert engine._reap_sandboxes(live_run_ids=engine._live_run_ids) == 0
        assert launcher.proc.poll() is None

        ahead.discard()
        engine.dispatch.release()
        assert not engine.dispatch.ahead
    finally:
        engine.stop()


# The read system call's number, as /proc/PID/syscall shows it: x86_64's, then the generic
# table's (aarch64, riscv64).
_READ_SYSCALLS = {"0", "63"}


def _waiting_for_release(launcher: Any) -> bool:
    """Whether the sandbox's pid 1 (bubblewrap's child, the launcher's only one) sits in a
    read of the release fd, where bwrap holds the command until floom releases it."""
    try:
        (child,) = (
            Path(f"/proc/{launcher.proc.pid}/task/{launcher.proc.pid}/children").read_text().split()
        )
        call = Path(f"/proc/{child}/syscall").read_text().split()
    except (OSError, ValueError):
        return False
    return call[0] in _READ_SYSCALLS and int(call[1], 16) == launcher.child_fds.release


def _pipe_of(fd: int) -> int | None:
    """The inode of the pipe `fd` holds, None once it is closed."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None
