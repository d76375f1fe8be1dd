"""A run's stage mounted from floom's own process, in its launcher's mount namespace
(floom/sandbox/local/ns_mount.py), never in floom's own."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox
from floom.sandbox.base import SandboxResult, SandboxSpec
from floom.sandbox.local import backend as local
from floom.sandbox.local import standby
from floom.sandbox.local.ns_mount import Mount, NamespaceMounter
from tests.support.harness import wait_until

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root floom mounts overlays"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


def _layers(root: Path) -> tuple[str, Path, Path]:
    lower, upper, scratch = root / "lower", root / "upper", root / "scratch"
    for path in (lower, upper, scratch):
        path.mkdir(parents=True)
    (lower / "shipped.txt").write_text("from the version\n")
    return f"lowerdir={lower},upperdir={upper},workdir={scratch}", lower, upper


def _in_namespace_of_its_own(command: str, *args: object) -> subprocess.Popen[bytes]:
    """A process in a mount namespace of its own (as a launcher is), running `command` once
    it reads a line from its stdin."""
    other = subprocess.Popen(
        ["unshare", "--mount", "--propagation=slave", "--", "sh", "-c", command, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    theirs = f"/proc/{other.pid}/ns/mnt"
    wait_until(lambda: os.readlink(theirs) != os.readlink("/proc/self/ns/mnt"), timeout=10)
    return other


def _mounted_on(target: Path) -> bool:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(target) for line in mounts)


def test_nothing_is_mounted_for_a_process_in_floom_s_own_namespace(tmp_path: Path) -> None:
    # A launcher that has not made its namespace yet shares floom's: a mount there would be
    # the host's, seen by every other launcher. The caller's script mounts it instead.
    options, _lower, _upper = _layers(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    child = subprocess.Popen(["sleep", "30"])
    mounts = (Mount.overlay(options, str(target)), Mount.bind(str(tmp_path / "upper"), str(target)))
    try:
        mounter = NamespaceMounter()
        assert mounter.start(child.pid, mounts).wait() == (False, False)
        assert mounter.start(os.getpid(), mounts).wait() == (False, False)
    finally:
        child.kill()
        child.wait()
    assert not _mounted_on(target)
    assert list(target.iterdir()) == []


def test_the_overlay_lands_in_the_other_process_s_namespace_only(tmp_path: Path) -> None:
    options, _lower, upper = _layers(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    other = _in_namespace_of_its_own("read x; ls $0", target)
    try:
        mounts = (Mount.overlay(options, str(target)),)
        assert NamespaceMounter().start(other.pid, mounts).wait() == (True,)
        seen, _ = other.communicate(b"go\n", timeout=10)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    assert seen == b"shipped.txt\n"  # the version's file, through the overlay
    assert not _mounted_on(target)  # floom's own namespace is untouched
    assert list(target.iterdir()) == []
    assert list(upper.iterdir()) == []


def _ready_in_namespaces_of_their_own(sandbox: LocalSandbox) -> bool:
    """Whether the standby's launchers are all ready, each in its own mount namespace (one
    started on the spot may not be yet: its script then makes the mounts, the fallback)."""
    waiting = sandbox.standby.waiting()
    ours = os.readlink("/proc/self/ns/mnt")
    try:
        return len(waiting) == standby.READY and all(
            os.readlink(f"/proc/{launcher.proc.pid}/ns/mnt") != ours for launcher in waiting
        )
    except OSError:
        return False


@dataclass
class _DataRun:
    """A run of a script that reads data.txt (the version's, or its work dir's own), appends
    to it and writes to its output dir."""

    result: SandboxResult
    lines: list[str]
    files: Path
    work: Path
    output: Path

    def check(self, layered: bool) -> None:
        assert self.result.exit_code == 0, (self.result, self.lines)
        assert self.lines == ["original"], (self.result, self.lines)
        assert (self.work / "data.txt").read_text() == "original\nmore\n"
        assert (self.output / "made").read_text() == "made\n"
        if layered:
            assert (self.files / "data.txt").read_text() == "original\n"


def _run_on_data(tmp_path: Path, *, layered: bool, launchers_ready: bool) -> _DataRun:
    files, work, output = tmp_path / "v1", tmp_path / "r" / "work", tmp_path / "r" / "output"
    for path in (files, work, output):
        path.mkdir(parents=True)
    (files if layered else work).joinpath("data.txt").write_text("original\n")
    sandbox = LocalSandbox()
    lines: list[str] = []
    spec = SandboxSpec(
        run_id="run_ns_mount",
        command=["sh", "-c", "cat data.txt; echo more >> data.txt; echo made > /output/made"],
        workdir=work,
        output_dir=output,
        files=files if layered else None,
        timeout_seconds=30,
    )
    try:
        if launchers_ready:
            sandbox.standby.replenish()
            wait_until(lambda: _ready_in_namespaces_of_their_own(sandbox))
        result = sandbox.run(spec, on_line=lambda _s, line: lines.append(line), should_cancel=bool)
    finally:
        sandbox.close()
    return _DataRun(result, lines, files, work, output)


@pytest.mark.parametrize("layered", [True, False], ids=["overlay", "bind"])
def test_a_run_s_script_mounts_nothing_for_its_work_and_output_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layered: bool
) -> None:
    sent: list[str] = []
    real_begin, real_start = standby.Launcher.begin, standby.Launcher.start

    def recording_begin(launcher: standby.Launcher, prelude: str) -> None:
        sent.append(prelude)
        real_begin(launcher, prelude)

    def recording_start(launcher: standby.Launcher, *args: object, **kwargs: object) -> None:
        sent.append(str(kwargs.get("prelude", "")))
        real_start(launcher, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(standby.Launcher, "begin", recording_begin)
    monkeypatch.setattr(standby.Launcher, "start", recording_start)

    _run_on_data(tmp_path, layered=layered, launchers_ready=True).check(layered)
    assert sent, sent
    assert not any("mount" in prelude for prelude in sent), sent


def test_each_mount_is_made_or_refused_on_its_own(tmp_path: Path) -> None:
    # A refused mount (here a bind of a source that is not there) leaves it to the caller's
    # script; the job's other mounts are made all the same.
    output, target = tmp_path / "output", tmp_path / "target"
    for path in (output, target):
        path.mkdir()
    (output / "mine").write_text("x")
    other = _in_namespace_of_its_own("read x; ls $0", target)
    try:
        mounts = (
            Mount.bind(str(tmp_path / "gone"), str(target)),
            Mount.bind(str(output), str(target)),
        )
        assert NamespaceMounter().start(other.pid, mounts).wait() == (False, True)
        seen, _ = other.communicate(b"go\n", timeout=10)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    assert seen == b"mine\n"
    assert not _mounted_on(target)


@pytest.mark.parametrize("layered", [True, False], ids=["overlay", "bind"])
def test_a_run_whose_mounts_floom_could_not_make_has_its_script_make_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layered: bool
) -> None:
    # The mount thread unavailable (its setup failed, or it was stuck in a launcher's
    # namespace): every mount falls back to the launcher's script, and the run sees the same
    # dirs as when floom mounts them.
    sent: list[str] = []
    real_begin = standby.Launcher.begin

    def recording_begin(launcher: standby.Launcher, prelude: str) -> None:
        sent.append(prelude)
        real_begin(launcher, prelude)

    monkeypatch.setattr(standby.Launcher, "begin", recording_begin)
    monkeypatch.setattr(local._MOUNTER, "_broken", True)

    run = _run_on_data(tmp_path, layered=layered, launchers_ready=False)

    run.check(layered)
    script = "".join(sent)
    # The run dir bound at the stage's plain name, each dir bound or laid from there.
    assert f"--bind {run.output.parent} /run/floom-sandbox/.run\n" in script, script
    assert "--bind /run/floom-sandbox/.run/output /run/floom-sandbox/output\n" in script, script
    assert ("-t overlay" in script) == layered, script
    work_bind = "--bind /run/floom-sandbox/.run/work /run/floom-sandbox/work\n"
    assert (work_bind in script) != layered, script
