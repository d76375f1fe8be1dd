"""Launchers started ahead of their runs: each waits in a cgroup of its own, joined before the
run arrives, and execs exactly the command line and environment it is sent."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox
from floom.sandbox.base import SandboxResult, SandboxUnavailable
from floom.sandbox.local import cgroups, identity, standby
from floom.sandbox.local.standby import LAUNCHER_NAME, Standby, start_launcher
from tests.support.harness import wait_until
from tests.support.rigs.sandboxes import Lines, run_script

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)
needs_cgroups = pytest.mark.skipif(
    not cgroups.detect().enforced, reason="no usable cgroup hierarchy on this node"
)
# Characters a shell would read as its own: quotes, substitutions, separators, a newline.
HOSTILE = 'it\'s "$(touch /output/pwned)" `touch /output/pwned2`; $HOME \\ \n next'


def _cgroup_paths(pid: int) -> set[str]:
    return {line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()}


def _own_launchers() -> set[int]:
    """The launcher shells this test process started that are still running (other tests'
    sandboxes keep theirs until they are collected)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if LAUNCHER_NAME.encode() in argv and int(stat[1]) == os.getpid() and stat[0] != "Z":
            found.add(int(entry))
    return found


@needs_cgroups
def test_a_launcher_waits_in_its_own_cgroup_in_every_hierarchy_before_its_run() -> None:
    launcher = start_launcher()
    try:
        assert launcher.alive()
        assert launcher.cgroup is not None
        paths = _cgroup_paths(launcher.proc.pid)
        dirs = set(launcher.cgroup.dirs.values())
        for directory in dirs:
            assert any(directory.as_posix().endswith(path) for path in paths if path != "/")
        assert len({d.name for d in dirs}) == 1
        pids = launcher.cgroup.dirs.get(cgroups.PROCESSES)
        if pids is not None:  # no limit until a run writes its own
            assert (pids / "pids.max").read_text().strip() == "max"
    finally:
        launcher.discard()
    assert not launcher.alive()
    assert not any(directory.exists() for directory in dirs)


@needs_cgroups
def test_a_run_takes_a_launcher_whose_cgroup_was_joined_before_the_run_was_asked_for(
    tmp_path: Path,
) -> None:
    sandbox = LocalSandbox()
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    try:
        first, lines = run_script(sandbox, tmp_path / "first", "print('one')")
        assert first.exit_code == 0, lines
        wait_until(lambda: len(sandbox.standby.waiting()) == 2)
        waiting = sandbox.standby.waiting()
        result, lines = run_script(sandbox, tmp_path / "second", "print('two')")
        left = sandbox.standby.waiting()
    finally:
        sandbox.close()

    assert result.exit_code == 0, lines
    # The oldest became the second run's bwrap (reaped when the run ended) and its cgroup
    # went with the run.
    assert waiting[0].proc.returncode == 0
    assert waiting[0].cgroup is not None
    assert not any(path.exists() for path in waiting[0].cgroup.dirs.values())
    assert left  # closing the sandbox ended the ones still waiting
    assert not any(launcher.alive() for launcher in left)


def test_the_command_gets_its_environment_and_arguments_verbatim_and_only_three_streams(
    tmp_path: Path,
) -> None:
    result, lines = run_script(
        LocalSandbox(),
        tmp_path,
        """
        import json, os, sys
        fds = sorted(os.listdir("/proc/self/fd"))
        stdin = os.readlink("/proc/self/fd/0")
        print(json.dumps([sys.argv[1:], os.environ["HOSTILE"], fds, stdin]))
        """,
        command=["python3", "run.py", HOSTILE, "$PATH"],
        env={"HOSTILE": HOSTILE},
    )

    assert result.exit_code == 0, lines
    [(_stream, line)] = lines
    argv, value, fds, stdin = json.loads(line)
    assert argv == [HOSTILE, "$PATH"]
    assert value == HOSTILE
    assert os.listdir(tmp_path / "output") == []
    # stdin, stdout, stderr and the one os.listdir read the list through: no pipe of the
    # launcher's, no seccomp filter or resolv.conf left open.
    assert fds == ["0", "1", "2", "3"]
    assert stdin == "/dev/null"


def test_a_launcher_runs_the_lines_sent_ahead_while_the_rest_is_built(tmp_path: Path) -> None:
    # A run's stage mounts are made while floom prepares the rest of the script.
    launcher = start_launcher()
    made = tmp_path / "made"
    try:
        launcher.begin(f"mkdir {made}")
        wait_until(made.is_dir, timeout=10)
        assert launcher.alive()

        launcher.start([shutil.which("sh") or "sh", "-c", "echo rest"], b"", resolv_conf=b"")
        assert launcher.proc.stdout is not None
        assert launcher.proc.stdout.read() == b"rest\n"
        assert launcher.proc.wait(timeout=10) == 0
    finally:
        launcher.discard()


def test_a_launcher_left_without_a_run_exits_on_its_own() -> None:
    # The pipe floom would send the script on closes when floom ends, however it ends.
    launcher = start_launcher()
    try:
        assert launcher.proc.stdin is not None
        launcher.proc.stdin.close()
        assert launcher.proc.wait(timeout=10) == 0
    finally:
        launcher.discard()


def test_a_dead_ready_launcher_is_replaced_and_close_ends_the_rest() -> None:
    standby = Standby(ready=2)
    try:
        standby.take().discard()
        assert standby.waiting() == ()  # none until asked: starting one holds the GIL
        standby.replenish()
        wait_until(lambda: len(standby.waiting()) == 2)
        dead, alive = standby.waiting()
        os.kill(dead.proc.pid, signal.SIGKILL)
        dead.proc.wait(timeout=10)

        taken = standby.take()
        assert taken is alive
        taken.discard()
        assert dead.cgroup is None or not any(p.exists() for p in dead.cgroup.dirs.values())
        standby.replenish()
        wait_until(lambda: len(standby.waiting()) == 2)
        left = standby.waiting()
    finally:
        standby.close()

    assert standby.waiting() == ()
    assert not any(launcher.alive() for launcher in left)


@needs_cgroups
def test_close_ends_a_launcher_the_thread_is_starting_before_it_returns() -> None:
    # The thread is in the middle of starting a launcher (its command line is being built)
    # when the node stops.
    building, built = threading.Event(), threading.Event()

    def slow_command() -> list[str]:
        building.set()
        threading.Event().wait(0.5)
        built.set()
        return standby.plain_launcher()

    waiting = Standby(ready=1, command=slow_command)
    before = _own_launchers()
    waiting.replenish()
    assert building.wait(10)
    waiting.close()
    # Its launcher was started and ended before close returned, not after.
    assert built.is_set()
    assert _own_launchers() - before == set()
    assert waiting.waiting() == ()


def test_a_launcher_that_cannot_join_its_cgroup_is_ended_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory that is no cgroup: creating the run's group works, moving into it fails.
    parent = tmp_path / "not-a-cgroup"
    parent.mkdir()
    tree = cgroups.CgroupTree(version=1, parents={cgroups.PROCESSES: parent})
    monkeypatch.setattr(cgroups, "detect", lambda: tree)
    before = _own_launchers()

    with pytest.raises(SandboxUnavailable) as refused:
        run_script(LocalSandbox(), tmp_path, "print('never')")

    assert "cannot put the run under its limits" in refused.value.message
    assert list(parent.iterdir()) == []
    assert _own_launchers() <= before  # other tests' sandboxes may end theirs meanwhile


def test_a_missing_shell_is_reported_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "sh" else real_which(name, *a, **k)
    )
    with pytest.raises(SandboxUnavailable) as refused:
        start_launcher()  # as floom's own uid; as root the stage's tools are checked

    assert "sh is not on PATH" in refused.value.message


def test_running_out_of_descriptors_is_a_sandbox_error_that_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_pipe = os.pipe
    made: list[tuple[int, int]] = []

    def second_pipe_fails() -> tuple[int, int]:
        if made:
            raise OSError(errno.EMFILE, "Too many open files")
        made.append(real_pipe())
        return made[-1]

    monkeypatch.setattr(os, "pipe", second_pipe_fails)
    real_close = os.close
    closed: list[int] = []

    def recorded_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "close", recorded_close)
    groups: list[cgroups.RunCgroup] = []
    real_make = cgroups.CgroupTree.make

    def recorded_make(tree: cgroups.CgroupTree, name: str) -> cgroups.RunCgroup:
        groups.append(real_make(tree, name))
        return groups[-1]

    monkeypatch.setattr(cgroups.CgroupTree, "make", recorded_make)

    with pytest.raises(SandboxUnavailable) as refused:
        start_launcher()

    assert "Too many open files" in refused.value.message
    assert set(made[0]) <= set(closed)  # the first pipe was closed again
    for group in groups:  # and the cgroup made for it removed
        assert not any(path.exists() for path in group.dirs.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root floom gives launchers a stage")
def test_a_launcher_made_before_a_host_mount_still_sees_it(tmp_path: Path) -> None:
    # The launcher's mount namespace follows the host's (a slave): a data dir mounted after
    # the launchers were started is there for their runs, not an empty directory under it.
    sandbox = LocalSandbox()
    later = tmp_path / "mounted-later"
    later.mkdir()
    (tmp_path / "first").mkdir()
    try:
        first, lines = run_script(sandbox, tmp_path / "first", "print('one')")
        assert first.exit_code == 0, lines
        wait_until(lambda: len(sandbox.standby.waiting()) == 2)
        launcher = sandbox.standby.waiting()[0]
        assert os.readlink(f"/proc/{launcher.proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        subprocess.run(["mount", "-t", "tmpfs", "floom-test", str(later)], check=True)
        try:
            result, lines = run_script(sandbox, later, "print('seen')")
        finally:
            subprocess.run(["umount", "--lazy", str(later)], check=True)
    finally:
        sandbox.close()

    assert result.exit_code == 0, lines
    assert lines == [("stdout", "seen")]


def test_an_idle_launcher_is_replaced_once_it_is_too_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standby, "MAX_AGE_SECONDS", 0.5)
    waiting = Standby(ready=1)
    try:
        waiting.take().discard()
        waiting.replenish()
        wait_until(lambda: len(waiting.waiting()) == 1)
        [first] = waiting.waiting()
        wait_until(lambda: waiting.waiting() not in ((), (first,)))
        assert not first.alive()
        assert first.cgroup is None or not any(p.exists() for p in first.cgroup.dirs.values())
    finally:
        waiting.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root floom gives launchers a stage")
def test_runs_bind_onto_the_stage_in_their_launchers_namespace_only(tmp_path: Path) -> None:
    # Every run's directories go onto the stage's same fixed names, each in the mount
    # namespace of its own launcher: two runs at once see their own, the host sees none.
    sandbox = LocalSandbox()
    results: dict[str, tuple[object, list[tuple[str, str]]]] = {}
    # Each run waits, its output written, until both are (the test says "go" in both work
    # dirs): the two sandboxes are up at the same time.
    script = """
    import os, time
    open("/output/mine", "w").write(open("inputs.json").read())
    deadline = time.monotonic() + 30
    while not os.path.exists("go") and time.monotonic() < deadline:
        time.sleep(0.01)
    print(sorted(os.listdir("/output")), open("/output/mine").read())
    """

    def run(name: str) -> None:
        folder = tmp_path / name
        (folder / "work").mkdir(parents=True)
        (folder / "work" / "inputs.json").write_text(name)
        results[name] = run_script(sandbox, folder, script)

    try:
        threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        mine = [tmp_path / name / "output" / "mine" for name in ("a", "b")]
        wait_until(lambda: all(path.exists() for path in mine), timeout=30)
        for name in ("a", "b"):
            (tmp_path / name / "work" / "go").touch()
        for thread in threads:
            thread.join(60)
    finally:
        sandbox.close()

    for name in ("a", "b"):
        _result, lines = results[name]
        assert lines == [("stdout", f"['mine'] {name}")], lines
        assert (tmp_path / name / "output" / "mine").read_text() == name
    for point in ("work", "output", ".files", ".run"):
        assert os.listdir(identity.STAGE_DIR / point) == []
        assert stat.S_IMODE(os.stat(identity.STAGE_DIR / point).st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="the stage is root's")
def test_the_stage_is_made_root_s_and_world_traversable_and_a_link_is_refused(
    tmp_path: Path,
) -> None:
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o700)
    (stage / "work").mkdir(mode=0o700)
    identity.make_stage(stage)
    points = ("work", "output", ".files", ".run")
    for path in (stage, *(stage / name for name in points)):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o755
        assert os.lstat(path).st_uid == 0

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (stage / "output").rmdir()
    (stage / "output").symlink_to(elsewhere)
    with pytest.raises(identity.IdentityUnavailable) as refused:
        identity.make_stage(stage)
    assert f"{stage}/output is not a directory of root's" in refused.value.message
    os.chown(elsewhere, 65534, 65534)
    (stage / "output").unlink()
    elsewhere.rename(stage / "output")
    with pytest.raises(identity.IdentityUnavailable):
        identity.make_stage(stage)


def _run_in(sandbox: LocalSandbox, base: Path, script: str) -> tuple[SandboxResult, Lines]:
    (base / "work").mkdir(parents=True)
    return run_script(sandbox, base, script)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root floom gives launchers a stage")
def test_an_output_dir_that_holds_files_is_bound_as_it_is(tmp_path: Path) -> None:
    # Artifacts restored after a pause: the run sees exactly its own files, and what it adds
    # lands beside them.
    sandbox = LocalSandbox()
    script = "import os; print(sorted(os.listdir('/output'))); open('/output/new', 'w')"
    try:
        (tmp_path / "full" / "output").mkdir(parents=True)
        (tmp_path / "full" / "output" / "restored").write_text("kept")
        full, lines = _run_in(sandbox, tmp_path / "full", script)
    finally:
        sandbox.close()

    assert full.exit_code == 0, lines
    assert lines == [("stdout", "['restored']")], lines
    assert sorted(os.listdir(tmp_path / "full" / "output")) == ["new", "restored"]
