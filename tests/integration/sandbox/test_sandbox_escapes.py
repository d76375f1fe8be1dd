"""A hostile run that tries to outlive itself, cold and warm: a double-forked, setsid
daemon that ignores SIGTERM and SIGHUP and keeps the run's output pipes open. The run ends
when its script does, with the script's status, nothing of its uid is left on the host, and
the next run works."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox, SandboxResult
from floom.sandbox.base import Sandbox
from tests.support.rigs.sandboxes import Lines, run_script
from tests.support.rigs.warm import WarmedLocal, cold_or_warm, warm_script_spec

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs as their own uids need a root floom"),
]


@pytest.fixture(params=["cold", "warm"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    with cold_or_warm(request.param, tmp_path) as sandbox:
        yield sandbox


def run(sandbox: Sandbox, tmp_path: Path, script: str) -> tuple[SandboxResult, Lines]:
    if isinstance(sandbox, WarmedLocal):
        spec = warm_script_spec(sandbox.work_root, script, timeout_seconds=30.0)
        lines: Lines = []
        result = sandbox.run(
            spec, on_line=lambda s, line: lines.append((s, line)), should_cancel=lambda: False
        )
        return result, lines
    run_dir = tmp_path / f"run-{len(os.listdir(tmp_path))}"
    run_dir.mkdir()
    return run_script(sandbox, run_dir, script)


DAEMON = """
import json, os, signal, time
uid = os.getuid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        while True:  # keeps stdout and stderr open, and prints now and then
            print("daemon alive", flush=True)
            time.sleep(0.2)
    os._exit(0)
time.sleep(0.5)
# The clock /proc's start times count in (no time namespace here): what the run started,
# it started before this.
ended = time.clock_gettime(time.CLOCK_BOOTTIME)
print(json.dumps({"uid": uid, "ended": ended}), flush=True)
raise SystemExit(3)
"""


def _stat(pid: str) -> list[str]:
    """State, then parent pid, ... of process `pid` ([] when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()


def processes_of(uid: int, *, started_before: float | None = None) -> list[int]:
    """The live (not zombie) processes of host uid `uid`; with `started_before` (seconds of
    CLOCK_BOOTTIME), only those started before then: a uid a run gave back is any sandbox's
    to take at once, the suite's other worker's too, and what runs as it then is not the
    run's leftover."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                owner = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
            fields = _stat(entry)
            if owner != uid or fields[:1] in (["Z"], []):
                continue
            # field 22 (the 20th after the command): the start, in clock ticks since boot
            if started_before is None or int(fields[19]) < int(started_before * ticks):
                found.append(int(entry))
    return found


def zombie_children() -> list[int]:
    me = str(os.getpid())
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _stat(entry)[:2] == ["Z", me]
    ]


def _named(pids: list[int]) -> list[str]:
    """Each zombie as its pid and command, and its uid (a run's, or floom's own): what a
    failure says, so that it tells a run's reporter from a warm interpreter."""
    named = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            comm, uid = "?", -1
        named.append(f"{pid} {comm} uid {uid}")
    return named


@pytest.fixture
def as_pid_one() -> Iterator[None]:
    """This process as floom is when it is its container's pid 1 (no init): the subreaper
    the kernel hands every orphan below it to."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in zombie_children():  # what a failed case left: not the next test's
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


_PR_SET_CHILD_SUBREAPER = 36


def test_a_daemon_the_run_leaves_ends_with_it_and_the_next_run_works(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    result, lines = run(sandbox, tmp_path, DAEMON)

    assert not result.timed_out, lines[-3:]
    assert result.exit_code == 3, lines[-3:]
    told = next(json.loads(line) for stream, line in lines if line.startswith("{"))
    assert processes_of(told["uid"], started_before=told["ended"]) == []
    after, lines = run(sandbox, tmp_path, "print('next')")
    assert after.exit_code == 0, lines
    assert ("stdout", "next") in lines


def test_a_run_leaves_floom_no_zombie_when_floom_is_its_container_s_pid_one(
    sandbox: Sandbox, tmp_path: Path, as_pid_one: None
) -> None:
    """bubblewrap exits as soon as the command does, before the sandbox's pid 1: the kernel
    hands that pid 1 to floom when floom is its container's pid 1 (docker-compose's
    executor-bwrap has no init), and nothing reaped it: a zombie for good per cold run,
    until the container could start no process."""
    for _ in range(3):
        result, lines = run(sandbox, tmp_path, "print('hello')")
        assert result.exit_code == 0, lines

    assert zombie_children() == [], _named(zombie_children())


WAIT_FOR_GO = """
import os, time
print("started", flush=True)
deadline = time.monotonic() + 20
while not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def test_a_warm_run_whose_warm_process_died_leaves_floom_no_zombie(
    tmp_path: Path, as_pid_one: None
) -> None:
    """A warm run's reporter (the child of its warm process that waits for its pid 1) is
    handed to floom when that warm process dies mid-run (recycled, or killed): reaped once
    the run ends, not left a zombie."""
    (tmp_path / "root").mkdir()
    warm = WarmedLocal(LocalSandbox(), tmp_path / "root")
    try:
        spec = warm_script_spec(warm.work_root, WAIT_FOR_GO)
        key = warm.warm_up(spec)
        process = warm.pools.process_of(key)
        assert process is not None

        def on_line(stream: str, line: str) -> None:
            if line == "started":
                os.kill(process.pid, 9)
                threading.Timer(0.5, (spec.workdir / "go").write_text, [""]).start()

        result = warm.run(spec, on_line=on_line, should_cancel=lambda: False)
        assert result.exit_code == 0
    finally:
        warm.close()

    assert zombie_children() == [], _named(zombie_children())


def test_a_warm_process_ending_after_its_runs_leaves_floom_no_zombie_when_bubblewrap_ends_first(
    tmp_path: Path, as_pid_one: None
) -> None:
    """A warm process closed with a run in flight ends on its own after it, a thread reaping
    its bubblewrap; should bubblewrap end first (killed, or the thread that started it ended:
    its parent-death signal), the kernel hands the namespace's pid 1 to floom and kills it.
    That thread reaped bubblewrap only, and a warm sandbox's close that came later found
    nothing left to end: pid 1 stayed floom's zombie (the warm-process-died case above failed
    so, once, under load: its pool's thread, bubblewrap's parent, ended as the sandbox
    closed)."""
    (tmp_path / "root").mkdir()
    warm = WarmedLocal(LocalSandbox(), tmp_path / "root")
    runner: threading.Thread | None = None
    try:
        spec = warm_script_spec(warm.work_root, WAIT_FOR_GO)
        key = warm.warm_up(spec)
        process = warm.pools.process_of(key)
        assert process is not None
        started = threading.Event()
        ended: list[object] = []

        def on_line(stream: str, line: str) -> None:
            if line == "started":
                started.set()

        def run_it() -> None:
            try:
                ended.append(warm.run(spec, on_line=on_line, should_cancel=lambda: False))
            except Exception as exc:  # the run is killed with its namespace: either way
                ended.append(exc)

        runner = threading.Thread(target=run_it)
        runner.start()
        assert started.wait(30.0)
        init = os.pidfd_open(process.init_pid)
        try:
            before = set(threading.enumerate())
            process.close()  # a run in flight: it ends on its own after it
            (reaper,) = [
                t for t in set(threading.enumerate()) - before if t.name == "floom-warm-reap"
            ]
            os.kill(process.proc.pid, signal.SIGKILL)  # bubblewrap ends first
            assert select.select([init], [], [], 30.0)[0], "pid 1 outlived its bubblewrap"
        finally:
            os.close(init)
        reaper.join(30.0)
        assert not reaper.is_alive()

        assert zombie_children() == [], _named(zombie_children())
    finally:
        if runner is not None:
            runner.join(60.0)
        warm.close()
