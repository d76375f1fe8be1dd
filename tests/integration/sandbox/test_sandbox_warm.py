"""Warm starts (floom/sandbox/local/warm/), run for real under bubblewrap: what one warm
process's runs must not share, what their limits stop, and how its pool recovers."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox, SandboxResult, SandboxSpec
from floom.sandbox.local import limits, procfs, uid_pool
from floom.sandbox.local.backend import system_args
from floom.sandbox.local.uid_pool import UidPool
from floom.sandbox.local.warm.inside import RECORD_NAME
from floom.sandbox.local.warm.pools import (
    WarmKey,
    WarmPools,
    WarmSettings,
    read_record,
    warm_prefix,
)
from floom.sandbox.local.warm.process import (
    INSIDE,
    PreparedChild,
    WarmProcess,
    WarmUnavailable,
    pidfd_exit_supported,
)
from tests.support.harness import wait_until
from tests.support.processes.statuses import process_statuses
from tests.support.rigs.sandboxes import Lines
from tests.support.rigs.warm import WarmedLocal, warm_script_spec
from tests.support.stops import stop

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="warm starts need floom to run as root"),
]


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[WarmedLocal]:
    warmed = WarmedLocal(LocalSandbox(), tmp_path / "root")
    (tmp_path / "root").mkdir()
    yield warmed
    warmed.close()


_PR_SET_CHILD_SUBREAPER = 36


def uids_of(local: LocalSandbox) -> UidPool:
    """The sandbox uid pool of a root floom's local sandbox."""
    assert local._uids is not None
    return local._uids


def held_here(pool: UidPool) -> set[int]:
    """The uids of `pool`'s range this process holds: what `held()` finds held by other
    processes (the suite's other worker, any floom on the machine) comes and goes meanwhile."""
    with uid_pool._HOLDING:
        return {uid for uid in uid_pool._HELD if pool.uids.base <= uid <= pool.uids.last}


def warmed_from(tmp_path: Path, source: str, settings: WarmSettings | None = None) -> WarmedLocal:
    """A local sandbox whose warm processes run `source` (inside.py's, with something
    planted), its pools under `settings`, serving runs in `tmp_path`/root."""
    local = LocalSandbox()
    local.warm = WarmPools(
        settings or WarmSettings(), system_args=system_args, uids=uids_of(local), source=source
    )
    (tmp_path / "root").mkdir()
    return WarmedLocal(local, tmp_path / "root")


def run(
    warm: WarmedLocal, script: str, *, should_cancel: object = None, **fields: object
) -> tuple[SandboxResult, Lines, SandboxSpec]:
    spec = warm_script_spec(warm.work_root, script, **fields)
    lines: Lines = []
    result = warm.run(
        spec,
        on_line=lambda stream, line: lines.append((stream, line)),
        should_cancel=should_cancel or (lambda: False),  # type: ignore[arg-type]
    )
    return result, lines, spec


def outputs(lines: Lines) -> dict[str, object]:
    found = [json.loads(line) for stream, line in lines if stream == "stdout" and "{" in line]
    assert found, lines
    return found[-1]  # type: ignore[no-any-return]


PLANT = """
import json, os, random, sys
json.planted = "by the first run"
random.seed(1234)
os.environ["PLANTED"] = "yes"
open("/tmp/planted", "w").write("yes")
open("/dev/shm/planted", "w").write("yes")
keep = os.open("/tmp/planted", os.O_RDONLY)
print(json.dumps({"pid": os.getpid()}))
"""

LOOK = """
import json, os, random
print(json.dumps({
    "planted": getattr(json, "planted", None),
    "env": os.environ.get("PLANTED"),
    "tmp": os.path.exists("/tmp/planted"),
    "shm": os.path.exists("/dev/shm/planted"),
    "fds": sorted(os.listdir("/proc/self/fd")),
    "random": random.random(),
    "pid": os.getpid(),
}))
"""


def test_a_value_one_run_plants_in_its_warm_process_is_invisible_to_the_next(
    warm: WarmedLocal,
) -> None:
    first, lines, _ = run(warm, PLANT)
    assert first.exit_code == 0, lines
    assert outputs(lines)["pid"] == 1  # the script is its namespace's pid 1: it ran warm
    second, lines, _ = run(warm, LOOK)
    assert second.exit_code == 0, lines
    seen = outputs(lines)
    assert seen["planted"] is None
    assert seen["env"] is None
    assert not seen["tmp"]
    assert not seen["shm"]
    assert seen["fds"] == ["0", "1", "2", "3"]  # 3: the listing's own
    random_after_seed_1234 = 0.9664535356921388
    assert seen["random"] != random_after_seed_1234


def test_each_run_draws_its_own_random_state(warm: WarmedLocal) -> None:
    draws = set()
    for _ in range(3):
        result, lines, _ = run(warm, LOOK)
        assert result.exit_code == 0, lines
        draws.add(outputs(lines)["random"])
    assert len(draws) == 3


CONTROL_SOCKET = """
import json, os, socket, stat
sockets = []
for fd in range(3, 4096):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            sockets.append(fd)
    except OSError:
        pass
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({
    "sockets": sockets,
    "uid": os.getuid(),
    "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "cgroup": open("/proc/self/cgroup").read(),
    "hostname": socket.gethostname(),
}))
"""


def test_a_run_holds_no_socket_of_floom_nor_any_privilege(warm: WarmedLocal) -> None:
    result, lines, _ = run(warm, CONTROL_SOCKET)
    assert result.exit_code == 0, lines
    seen = outputs(lines)
    assert seen["sockets"] == []  # not the warm process's control socket, not its own
    assert int(seen["uid"]) >= 0x70000000  # type: ignore[call-overload]
    assert seen["caps"] == ["0000000000000000"] * 5
    assert seen["no_new_privs"] == "1"
    assert seen["seccomp"] == "2"
    assert seen["pids"] == [1]
    assert seen["hostname"] == "floom"


NAMESPACES = """
import ctypes, json, subprocess
libc = ctypes.CDLL(None, use_errno=True)
tried = {}
for name, flag in (("user", 0x10000000), ("net", 0x40000000), ("mount", 0x20000)):
    pid = libc.syscall(56, flag | 17, 0, 0, 0, 0)  # clone(flags | SIGCHLD)
    if pid == 0:
        libc._exit(0)
    tried["clone " + name] = ctypes.get_errno() if pid < 0 else "made"
    tried["unshare " + name] = ctypes.get_errno() if libc.unshare(flag) < 0 else "made"
done = subprocess.run(["unshare", "-U", "true"], capture_output=True)
tried["unshare(1)"] = done.returncode
print(json.dumps(tried))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe calls clone by number")
def test_a_warm_run_cannot_create_namespaces(warm: WarmedLocal) -> None:
    result, lines, _ = run(warm, NAMESPACES)
    assert result.exit_code == 0, lines
    tried = outputs(lines)
    assert "made" not in tried.values(), tried
    assert tried["unshare(1)"] != 0


TWO_AT_ONCE = """
import json, os, socket, time
mine = os.environ["WHO"]
open("/tmp/" + mine, "w").write(mine)
open("/dev/shm/" + mine, "w").write(mine)
listener = socket.socket(socket.AF_UNIX)
listener.bind("\\0floom-test-" + mine)
listener.listen()
print("ready", flush=True)
deadline = time.monotonic() + 20
while not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.01)
other = "b" if mine == "a" else "a"
try:
    socket.socket(socket.AF_UNIX).connect("\\0floom-test-" + other)
    reached = True
except OSError:
    reached = False
print(json.dumps({
    "tmp": sorted(os.listdir("/tmp")),
    "shm": sorted(os.listdir("/dev/shm")),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "reached": reached,
    "uid": os.getuid(),
}))
"""


def test_two_warm_runs_at_once_see_nothing_of_each_other(warm: WarmedLocal) -> None:
    warm.pools.settings = replace(warm.pools.settings, ready=2)
    spec_a = warm_script_spec(warm.work_root, TWO_AT_ONCE, env={"WHO": "a"})
    spec_b = warm_script_spec(warm.work_root, TWO_AT_ONCE, env={"WHO": "b"})
    key = warm.warm_up(spec_a)
    pool_ready = warm.pools.wait_ready(key, 20)
    assert pool_ready
    ready = {"a": threading.Event(), "b": threading.Event()}
    results: dict[str, tuple[SandboxResult, Lines]] = {}

    def start(who: str, spec: SandboxSpec) -> threading.Thread:
        lines: Lines = []

        def on_line(stream: str, line: str) -> None:
            lines.append((stream, line))
            if line == "ready":
                ready[who].set()

        def target() -> None:
            result = warm.local.run(
                warm.warm_spec(spec), on_line=on_line, should_cancel=lambda: False
            )
            results[who] = (result, lines)

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    hits = warm.hits()
    first = start("a", spec_a)
    assert ready["a"].wait(20)
    assert warm.pools.wait_ready(key, 20)
    second = start("b", spec_b)
    assert ready["b"].wait(20)
    for spec in (spec_a, spec_b):
        (spec.workdir / "go").write_text("")  # both are running now
    first.join(30)
    second.join(30)
    assert warm.hits() == hits + 2
    seen = {}
    for who, (result, lines) in results.items():
        assert result.exit_code == 0, lines
        seen[who] = outputs(lines)
    for who in ("a", "b"):
        assert seen[who]["tmp"] == [who]
        assert seen[who]["shm"] == [who]
        assert seen[who]["pids"] == [1]
        assert seen[who]["reached"] is False
    assert seen["a"]["uid"] != seen["b"]["uid"]


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

MEMORY_BOMB = """
hoard = []
while True:
    hoard.append(bytearray(8 * 1024 * 1024))
"""


@pytest.mark.parametrize(
    ("script", "fields", "limit"),
    [(FORK_BOMB, {"processes": 32}, "processes"), (MEMORY_BOMB, {"memory_mb": 64}, "memory")],
    ids=["fork bomb", "memory bomb"],
)
def test_a_bomb_is_stopped_by_its_limit_and_the_pool_serves_the_next_run(
    warm: WarmedLocal, script: str, fields: dict[str, int], limit: str
) -> None:
    probe = warm_script_spec(warm.work_root, LOOK)
    key = warm.warm_up(probe)
    process = warm.pools.process_of(key)
    assert process is not None
    result, lines, _ = run(warm, script, timeout_seconds=20.0, **fields)
    assert result.limit_exceeded == limit, (result, lines[-3:])
    after, lines, _ = run(warm, LOOK)
    assert after.exit_code == 0, lines
    assert warm.pools.process_of(key) is process
    assert process.alive()


SLEEP_THEN_WRITE = """
import json, os, sys, time
print("started", flush=True)
deadline = time.monotonic() + 20
while not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.01)
json.dump({"outputs": {"survived": True}}, open("result.json", "w"))
"""


def _started_in_a_thread(
    warm: WarmedLocal, spec: SandboxSpec, lines: Lines | None = None
) -> tuple[threading.Thread, list[SandboxResult]]:
    """SLEEP_THEN_WRITE run in a thread, once it printed "started": the thread, and the list
    its result is put in; its lines go to `lines` when given."""
    started = threading.Event()
    ended: list[SandboxResult] = []

    def on_line(stream: str, line: str) -> None:
        if lines is not None:
            lines.append((stream, line))
        if line == "started":
            started.set()

    def target() -> None:
        ended.append(warm.run(spec, on_line=on_line, should_cancel=lambda: False))

    thread = threading.Thread(target=target)
    thread.start()
    assert started.wait(20)
    return thread, ended


@dataclass
class InFlight:
    """A SLEEP_THEN_WRITE run started from a warm child of `process`, the warm process of
    pool `key`, waiting to be let go."""

    spec: SandboxSpec
    key: WarmKey
    process: WarmProcess
    thread: threading.Thread
    ended: list[SandboxResult]

    def let_go_and_see_it_survive(self) -> None:
        (self.spec.workdir / "go").write_text("")
        self.thread.join(30)
        assert self.ended
        assert self.ended[0].exit_code == 0
        assert json.loads((self.spec.workdir / "result.json").read_text())["outputs"]["survived"]


def _a_run_in_flight(warm: WarmedLocal) -> InFlight:
    spec = warm_script_spec(warm.work_root, SLEEP_THEN_WRITE)
    key = warm.warm_up(spec)
    process = warm.pools.process_of(key)
    assert process is not None
    thread, ended = _started_in_a_thread(warm, spec)
    return InFlight(spec, key, process, thread, ended)


def test_a_run_outlives_its_warm_process_killed_mid_run_and_a_new_one_serves_the_next(
    warm: WarmedLocal,
) -> None:
    flight = _a_run_in_flight(warm)
    key, process = flight.key, flight.process
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.alive()
    flight.let_go_and_see_it_survive()
    result, lines, _ = run(warm, LOOK)  # WarmedLocal waits for the replacement, and asserts a hit
    assert result.exit_code == 0, lines
    replacement = warm.pools.process_of(key)
    assert replacement is not None
    assert replacement is not process
    assert replacement.alive()


def test_a_warm_process_closed_while_dead_and_not_yet_reaped_leaves_its_runs_running(
    warm: WarmedLocal,
) -> None:
    # Killed, the interpreter hands its runs to its namespace's pid 1 and stays a zombie
    # until pid 1 reaps it; a close in that moment once saw no child of the interpreter and
    # killed the namespace, the run in flight with it (exit 137). pid 1 is held stopped here
    # so that the moment lasts: stopped indeed before the kill (a pid 1 merely sent SIGSTOP
    # still reaps the interpreter if it dies first: tests/support/stops.py).
    flight = _a_run_in_flight(warm)
    process = flight.process
    try:
        stop(process.init_pid)
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procfs.zombie_status(process.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.zombie_status(process.pid) is not None
        process.close()
    finally:
        os.kill(process.init_pid, signal.SIGCONT)
    flight.let_go_and_see_it_survive()


def test_a_deploy_during_runs_replaces_the_pool_and_lets_the_old_versions_runs_finish(
    warm: WarmedLocal,
) -> None:
    flight = _a_run_in_flight(warm)
    old_key, old = flight.key, flight.process
    warm.version = "v2"  # the next runs are of the version just deployed
    result, lines, new_spec = run(warm, LOOK)
    assert result.exit_code == 0, lines
    new_key = warm.key(new_spec)
    assert new_key is not None
    assert new_key != old_key
    new = warm.pools.process_of(new_key)
    assert new is not None
    assert new is not old
    assert warm.pools.process_of(old_key) is None
    with pytest.raises(WarmUnavailable):
        old.prepare()  # the version before's warm process serves no further run
    flight.let_go_and_see_it_survive()
    deadline = time.monotonic() + 10
    while old.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not old.alive()  # nor is it left once its last run has ended


def test_the_node_s_hits_and_misses_count_on_once_a_deploy_ends_the_pool_they_were_made_in(
    warm: WarmedLocal,
) -> None:
    # They are exported as counters (floom_warm_hits, _misses): one that went back when a
    # pool ends would read as a reset to a rate, and once told a test that a warm run of a
    # pool closed meanwhile had started cold.
    result, lines, _ = run(warm, LOOK)  # v1's recording run (a miss), then a hit
    assert result.exit_code == 0, lines
    before = warm.pools.stats()
    warm.version = "v2"  # its pool replaces v1's
    result, lines, _ = run(warm, LOOK)
    assert result.exit_code == 0, lines
    after = warm.pools.stats()
    assert [p["version"] for p in after["pools"]] == ["v2"]  # type: ignore[attr-defined]
    assert (after["hits"], after["misses"]) == (before["hits"] + 1, before["misses"] + 1)  # type: ignore[operator]


def _warm_children(warm_pid: int) -> list[dict[str, str]]:
    """/proc/<pid>/status of each process whose parent is `warm_pid`."""
    return [s for s in process_statuses() if s.get("PPid") == str(warm_pid)]


@pytest.mark.skipif(not pidfd_exit_supported(), reason="the kernel keeps no exit status for pidfds")
def test_a_warm_run_is_its_warm_process_s_own_child_and_its_exit_code_is_kept(
    warm: WarmedLocal,
) -> None:
    spec = warm_script_spec(warm.work_root, SLEEP_THEN_WRITE + "raise SystemExit(7)\n")
    key = warm.warm_up(spec)
    process = warm.pools.process_of(key)
    assert process is not None
    thread, ended = _started_in_a_thread(warm, spec)
    # One fork a run: the script is pid 1 of its namespace and the warm process's child,
    # already without root; no process of the run stays outside its PID namespace.
    root = str(process.lease.uid)  # prepared children are still its namespace's root
    running = [s for s in _warm_children(process.pid) if s["Uid"].split()[0] != root]
    (spec.workdir / "go").write_text("")
    thread.join(30)
    assert [s["NSpid"].split()[-1] for s in running] == ["1"]
    assert ended
    assert ended[0].exit_code == 7


HOLD_EXIT = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
namespace = os.open(f"/proc/{sys.argv[1]}/ns/pid", os.O_RDONLY)
assert libc.setns(namespace, 0x20000000) == 0, os.strerror(ctypes.get_errno())  # CLONE_NEWPID
pid = os.fork()
if pid == 0:
    while True:
        signal.pause()  # until its namespace's pid 1 ends, which kills it
print(pid, flush=True)
sys.stdin.read()  # reaped only once told: the namespace's pid 1 ends only then
os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not pidfd_exit_supported(), reason="the kernel keeps no exit status for pidfds")
def test_a_warm_run_ends_once_its_pid_1_has_begun_its_exit_not_once_that_exit_is_over(
    warm: WarmedLocal,
) -> None:
    # The kernel's teardown of pid 1 (its address space, its namespaces: 1-3 ms) is held
    # here for as long as the test likes: a PID namespace's pid 1 ends only once every
    # process of its namespace has been reaped, and this test puts one there whose parent,
    # outside, reaps it only when told.
    spec = warm_script_spec(warm.work_root, SLEEP_THEN_WRITE + "raise SystemExit(7)\n")
    key = warm.warm_up(spec)
    process = warm.pools.process_of(key)
    assert process is not None
    lines: Lines = []
    thread, ended = _started_in_a_thread(warm, spec, lines)
    holder: subprocess.Popen[str] | None = None
    try:
        root = str(process.lease.uid)  # prepared children are still its namespace's root
        [init_pid] = [
            int(s["Pid"]) for s in _warm_children(process.pid) if s["Uid"].split()[0] != root
        ]
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_EXIT, str(init_pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        assert holder.stdout.readline().strip()
        (spec.workdir / "go").write_text("")
        wait_until(lambda: ended, timeout=20.0)
        assert ended[0].exit_code == 7, lines
        assert json.loads((spec.workdir / "result.json").read_text())["outputs"]["survived"]
        # Its pid 1 was still in its exit: nothing of the run ran any more.
        status = procfs.exit_begun(init_pid, lambda: {init_pid})
        assert status is not None
        assert os.waitstatus_to_exitcode(status) == 7
        # Not while another task of the run is there (this one, say), nor for one that runs.
        assert procfs.exit_begun(init_pid, lambda: {init_pid, os.getpid()}) is None
        assert procfs.exit_begun(os.getpid(), lambda: {os.getpid()}) is None
    finally:
        if holder is not None:
            holder.communicate(timeout=30)
        thread.join(30)


def test_a_warm_run_s_pid_1_ends_its_output_before_it_exits(tmp_path: Path) -> None:
    # What floom waits for before it reads pid 1's status (runs.py `_Supervision`): its
    # output's end, just before its exit, not the descriptors' close by the exit itself.
    source = INSIDE.read_text()
    end = "        _exit(code)\n\n\ndef _write_record("
    assert end in source
    seen = (
        "        try:\n"
        "            os.fstat(1)\n"
        "            _said = 'open'\n"
        "        except OSError:\n"
        "            _said = 'closed'\n"
        "        with open('/output/stdout', 'w') as _f:\n"
        "            _f.write(_said)\n"
    )
    warm = warmed_from(tmp_path, source.replace(end, seen + end))
    try:
        result, lines, spec = run(warm, 'print("hello")')
        assert result.exit_code == 0, lines
        assert lines == [("stdout", "hello")]
        assert (spec.output_dir / "stdout").read_text() == "closed"
    finally:
        warm.close()


def _adopted(known: set[int]) -> list[int]:
    """This process's children not in `known`: once its sandbox is closed (which waits for
    the bubblewraps it started), what it adopted (runs, a warm process's own bubblewrap)."""
    return [
        int(status["Pid"])
        for status in _warm_children(os.getpid())
        if int(status["Pid"]) not in known
    ]


@pytest.mark.skipif(not pidfd_exit_supported(), reason="the kernel keeps no exit status for pidfds")
def test_a_run_whose_warm_process_dies_keeps_its_exit_code_when_its_adopter_never_reaps_it(
    tmp_path: Path,
) -> None:
    # This process adopts the run once its warm process is killed, and never reaps it, as a
    # floom that is its container's pid 1 would not.
    libc = ctypes.CDLL(None, use_errno=True)
    known = {int(status["Pid"]) for status in _warm_children(os.getpid())}
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    (tmp_path / "root").mkdir()
    warm = WarmedLocal(LocalSandbox(), tmp_path / "root")
    try:
        spec = warm_script_spec(warm.work_root, SLEEP_THEN_WRITE + "raise SystemExit(5)\n")
        key = warm.warm_up(spec)
        process = warm.pools.process_of(key)
        assert process is not None
        started = threading.Event()
        ended: list[SandboxResult] = []
        thread = threading.Thread(
            target=lambda: ended.append(
                warm.run(
                    spec,
                    on_line=lambda stream, line: started.set() if line == "started" else None,
                    should_cancel=lambda: False,
                )
            )
        )
        thread.start()
        assert started.wait(20)
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        (spec.workdir / "go").write_text("")
        thread.join(30)
        assert ended
        assert ended[0].exit_code == 5
    finally:
        warm.close()  # the killed process's prepared children end too, adopted here
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        deadline = time.monotonic() + 10
        while (adopted := _adopted(known)) and time.monotonic() < deadline:
            for pid in adopted:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)


SHARED_AT = 0x7E0000000000
SHARED_MAPPING = f"""
import ctypes, json
start = {SHARED_AT}
before = ctypes.string_at(start, 7)
ctypes.memmove(start, b"planted", 7)
print(json.dumps({{"before": before.decode("latin-1")}}))
"""


def test_shared_mappings_the_warm_process_made_are_private_to_each_run(tmp_path: Path) -> None:
    # A warm process that maps shared memory at start (as a library might at import), at an
    # address the runs know.
    plant = (
        "\nimport ctypes as _ctypes\n"
        "_plant = _ctypes.CDLL(None)\n"
        "_plant.mmap.restype = _ctypes.c_void_p\n"
        "_plant.mmap.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int,"
        " _ctypes.c_int, _ctypes.c_int, _ctypes.c_long]\n"
        f"assert _plant.mmap({SHARED_AT}, 4096, 3, 0x01 | 0x20 | 0x100000, -1, 0) == {SHARED_AT}\n"
    )
    source = INSIDE.read_text().replace(
        '\nif __name__ == "__main__":', plant + '\nif __name__ == "__main__":'
    )
    warm = warmed_from(tmp_path, source)
    try:
        for _ in range(2):
            result, lines, _ = run(warm, SHARED_MAPPING)
            assert result.exit_code == 0, lines
            assert outputs(lines)["before"] == "\0" * 7  # nothing of the run before
    finally:
        warm.close()


def test_a_run_whose_warm_child_fails_its_set_up_starts_cold_and_succeeds(
    tmp_path: Path,
) -> None:
    # The child is asked to set the run up and answers only when the run is released (the
    # claim commits meanwhile): a failure then still starts the run, cold.
    source = INSIDE.read_text().replace(
        '    memory = int(request["memory_bytes"])',
        '    raise OSError("a planted failure")',
    )
    assert source != INSIDE.read_text()
    warm = warmed_from(tmp_path, source)
    try:
        for _ in range(2):
            result, lines, _ = run(warm, LOOK)
            assert result.exit_code == 0, lines
            assert outputs(lines)["pid"] != 1  # cold: bubblewrap's init is pid 1
    finally:
        warm.close()


STARTED = """
open("/output/started", "w").write("yes")
print("started")
"""


def test_a_warm_run_s_script_starts_before_floom_reads_its_set_up_s_answer(
    warm: WarmedLocal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's start goes to its pid 1 with no round trip to floom after the set-up: pid 1
    # reads it once it has dropped its rights, while floom reads that it did.
    run(warm, LOOK)  # the pool recorded and ready
    spec = warm_script_spec(warm.work_root, STARTED)
    real_answer = PreparedChild.answer
    seen: list[bool] = []

    def answer_once_started(self: PreparedChild, timeout: float = 5.0) -> dict[str, object]:
        if not seen:
            started = spec.output_dir / "started"
            deadline = time.monotonic() + 10.0
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(started.exists())
        return real_answer(self, timeout)

    monkeypatch.setattr(PreparedChild, "answer", answer_once_started)
    lines: Lines = []
    result = warm.run(spec, on_line=lambda s, line: lines.append((s, line)), should_cancel=bool)
    assert result.exit_code == 0, lines
    assert seen == [True], "the script waited for floom to read its set-up's answer"


def test_a_warm_run_ends_without_waiting_for_its_cgroup_s_removal(
    warm: WarmedLocal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its cgroup is removed and its uid given back by a thread of their own, off its path.
    run(warm, LOOK)  # the pool recorded (by a cold run, which removes its own cgroup)
    assert warm.local.releases.drain(10.0)
    held = held_here(uids_of(warm.local))
    removing, removable = threading.Event(), threading.Event()
    real_close = limits.RunLimits.close

    def held_close(self: limits.RunLimits) -> bool:
        removing.set()
        removable.wait(60.0)
        return real_close(self)

    monkeypatch.setattr(limits.RunLimits, "close", held_close)
    found: list[tuple[SandboxResult, Lines, SandboxSpec]] = []
    runner = threading.Thread(target=lambda: found.append(run(warm, LOOK)))
    runner.start()
    try:
        wait_until(lambda: found, timeout=10.0)
        result, lines, _ = found[0]
        assert result.exit_code == 0, lines
        assert removing.wait(10.0), "its cgroup was never removed"
    finally:
        removable.set()
        runner.join(60.0)
    assert warm.local.releases.drain(10.0)
    assert held_here(uids_of(warm.local)) == held  # the run's uid given back, after its cgroup


def test_a_warm_process_serves_at_most_its_recycle_runs_then_its_successor_takes_over(
    tmp_path: Path,
) -> None:
    # Runs of one warm process share its string hash seed: a run tells its process by it.
    local = LocalSandbox(warm=WarmSettings(recycle_runs=3, ready=4))
    (tmp_path / "root").mkdir()
    warm = WarmedLocal(local, tmp_path / "root")
    try:
        seeds = []
        for _ in range(10):
            result, lines, _ = run(warm, 'import json\nprint(json.dumps({"h": hash("floom")}))')
            assert result.exit_code == 0, lines
            seeds.append(outputs(lines)["h"])
        runs_per_process = collections.Counter(seeds)
        assert max(runs_per_process.values()) <= 3, runs_per_process
        assert len(runs_per_process) >= 4
    finally:
        warm.close()


def test_a_run_starts_cold_when_no_warm_child_is_ready(tmp_path: Path) -> None:
    local = LocalSandbox()
    (tmp_path / "root").mkdir()
    spec = replace(warm_script_spec(tmp_path / "root", LOOK), warm="v1")
    try:
        lines: Lines = []
        result = local.run(
            spec, on_line=lambda *line: lines.append(line), should_cancel=lambda: False
        )
        assert result.exit_code == 0, lines
        assert outputs(lines)["pid"] != 1  # cold: bubblewrap's init is pid 1
    finally:
        local.close()


def test_warm_starts_turned_off_start_every_run_cold(tmp_path: Path) -> None:
    local = LocalSandbox(warm=WarmSettings(enabled=False))
    assert local.warm is None
    assert local.protections()["warm_starts"] is False
    local.close()


def test_the_warm_process_holds_no_secret_and_no_run_dir(warm: WarmedLocal) -> None:
    result, lines, spec = run(warm, LOOK, env={"API_TOKEN": "s3cr3t-warm-value"})
    assert result.exit_code == 0, lines
    key = warm.key(spec)
    assert key is not None
    process = warm.pools.process_of(key)
    assert process is not None
    for name in ("environ", "cmdline"):
        assert b"s3cr3t-warm-value" not in Path(f"/proc/{process.pid}/{name}").read_bytes()
    mounts = Path(f"/proc/{process.pid}/mountinfo").read_text()
    assert str(warm.work_root) not in mounts


def test_the_warm_process_sees_no_process_of_the_host_nor_of_another_sandbox(
    warm: WarmedLocal,
) -> None:
    result, lines, spec = run(warm, LOOK)
    assert result.exit_code == 0, lines
    key = warm.key(spec)
    assert key is not None
    process = warm.pools.process_of(key)
    assert process is not None
    assert os.readlink(f"/proc/{process.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    status = Path(f"/proc/{process.pid}/status").read_text()
    nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
    assert len(nspid) == 2  # the host's pid, then its own namespace's
    # That namespace's pid 1, which only reaps (and adopts the runs should the warm process
    # die), holds no capability.
    init = Path(f"/proc/{procfs.pid_of(process.init_pidfd)}/status").read_text()
    caps = dict(line.split(":\t", 1) for line in init.splitlines() if line.startswith("Cap"))
    assert int(caps["CapEff"], 16) == int(caps["CapPrm"], 16) == 0, caps
    # Its own /proc (read through its root): the processes of its namespace, each a fork of
    # the warm interpreter; the host's (this test's, floom's, any other sandbox's) are not
    # there to signal, trace, or reach the root of. (Once the run's release is over: the
    # run ended as its pid 1 began its exit, and a task in its exit has no command line.)
    assert warm.local.releases.drain(10.0)
    seen = Path(f"/proc/{process.pid}/root/proc")
    commands = []
    for entry in os.listdir(seen):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                commands.append((seen / entry / "cmdline").read_bytes())
    assert commands
    assert all(b"floom-warm:" in command for command in commands), [
        c[:80] for c in commands if b"floom-warm:" not in c
    ]


def test_reaping_kills_the_warm_processes_and_runs_an_earlier_floom_left_and_spares_its_own(
    warm: WarmedLocal,
) -> None:
    spec = warm_script_spec(warm.work_root, SLEEP_THEN_WRITE)
    key = warm.warm_up(spec)
    process = warm.pools.process_of(key)
    assert process is not None
    assert warm.kill_orphans(warm.work_root) == 0  # its own are live
    started = threading.Event()
    ended: list[SandboxResult] = []
    thread = threading.Thread(
        target=lambda: ended.append(
            warm.run(
                spec,
                on_line=lambda stream, line: started.set() if line == "started" else None,
                should_cancel=lambda: False,
            )
        )
    )
    thread.start()
    assert started.wait(20)
    later = LocalSandbox()  # the floom that starts after this one died
    try:
        # The warm process and the run's child are both found; the child may end with its
        # namespace (the warm process is its pid 1) before its own kill: not counted then.
        assert later.kill_orphans(warm.work_root) >= 1
    finally:
        later.close()
    thread.join(30)
    assert ended
    assert ended[0].exit_code != 0
    assert not (spec.workdir / "result.json").exists()
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.alive()


def test_an_idle_pool_ends_and_its_next_run_starts_cold_then_warm_again(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    warm = WarmedLocal(LocalSandbox(warm=WarmSettings(idle_seconds=0.5)), tmp_path / "root")
    try:
        spec = warm_script_spec(warm.work_root, LOOK)
        key = warm.warm_up(spec)
        process = warm.pools.process_of(key)
        assert process is not None
        deadline = time.monotonic() + 20
        while warm.pools.process_of(key) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert warm.pools.process_of(key) is None  # the idle pool ended ...
        while process.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process.alive()  # ... with its warm process
        result, lines, _ = run(warm, LOOK)  # a new pool from the record kept, warm again
        assert result.exit_code == 0, lines
    finally:
        warm.close()


def test_the_memory_budget_makes_an_idle_pool_give_way_to_a_new_one(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    # Room for one warm process (about 14 MiB resident here), not two.
    local = LocalSandbox(warm=WarmSettings(memory_mb=24))
    first = WarmedLocal(local, tmp_path / "root", version="a", worker="first")
    second = WarmedLocal(local, tmp_path / "root", version="b", worker="second")
    try:
        key_a = first.warm_up(warm_script_spec(first.work_root, LOOK))
        process_a = local.warm.process_of(key_a) if local.warm else None
        assert process_a is not None
        key_b = second.warm_up(warm_script_spec(second.work_root, LOOK))
        assert local.warm is not None
        assert local.warm.process_of(key_b) is not None
        assert local.warm.process_of(key_a) is None
        deadline = time.monotonic() + 10
        while process_a.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_a.alive()
    finally:
        local.close()


SOCKET_FAMILIES = """
import errno, json, socket
tried = {
    "unix": (1, 1, 0), "inet": (2, 2, 0), "inet6": (10, 2, 0), "netlink-route": (16, 3, 0),
    "vsock": (40, 1, 0), "packet": (17, 3, 0), "xdp": (44, 3, 0),
    "netlink-uevent": (16, 3, 15), "netlink-audit": (16, 3, 9), "alg": (38, 5, 0),
}
seen = {}
for name, (family, kind, protocol) in tried.items():
    try:
        socket.socket(family, kind, protocol).close()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
try:
    socket.socketpair(40, 1).close()
    seen["socketpair-vsock"] = "ok"
except OSError as exc:
    seen["socketpair-vsock"] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""


def test_a_warm_run_gets_the_same_socket_families_as_a_cold_one(warm: WarmedLocal) -> None:
    """The seccomp filter a warm run's pid 1 loads before the drop: vsock (issue 28), packet,
    XDP, other netlink protocols and AF_ALG refused as in a cold run."""
    result, lines, _ = run(warm, SOCKET_FAMILIES)

    assert result.exit_code == 0, lines
    seen = outputs(lines)
    allowed = {name: seen.pop(name) for name in ("unix", "inet", "inet6", "netlink-route")}
    assert allowed == dict.fromkeys(allowed, "ok")
    assert seen == dict.fromkeys(seen, "EAFNOSUPPORT")
    assert len(seen) == 7


# A warm run writes to the run dir's own disk (floom/sandbox/local/disks.py) as a cold run
# does: the kernel refuses what is past it, however the run writes (issue 28, item 3).
WARM_DISK_TRICKS = {
    "unlinked-while-open": """
import errno, os, time
held = []
try:
    for i in range(50):
        fd = os.open(f"u{i}", os.O_CREAT | os.O_WRONLY, 0o600)
        os.unlink(f"u{i}")
        held.append(fd)
        left = 19 << 20
        while left > 0:
            left -= os.write(fd, b"x" * min(left, 1 << 20))
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
    print("FULL", flush=True)
    time.sleep(60)
""",
    "sparse": """
import errno, os, time
fd = os.open("sparse.bin", os.O_CREAT | os.O_WRONLY, 0o600)
os.ftruncate(fd, 1 << 30)
try:
    for offset in range(0, 1 << 30, 1 << 20):
        os.pwrite(fd, b"x" * (256 << 10), offset)
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
    print("FULL", flush=True)
    time.sleep(60)
""",
}


@pytest.mark.parametrize("trick", sorted(WARM_DISK_TRICKS))
def test_a_warm_run_writes_no_further_than_its_run_s_own_disk(
    warm: WarmedLocal, trick: str
) -> None:
    local = warm.local
    if local.disks is None or not local.disks.usable():
        pytest.skip("a run's own disk needs root and loop devices")
    spec = warm_script_spec(warm.work_root, WARM_DISK_TRICKS[trick], disk_mb=20)
    run_dir = spec.workdir.parent
    shutil.rmtree(run_dir)  # made again as a mount point of a disk of its own
    local.make_run_dir(run_dir, disk_mb=20)
    spec.workdir.mkdir()
    spec.output_dir.mkdir()
    (spec.workdir / "run.py").write_text(WARM_DISK_TRICKS[trick])
    used: list[int] = []

    def on_line(stream: str, line: str) -> None:
        if line == "FULL":
            fs = os.statvfs(run_dir)
            used.append((fs.f_blocks - fs.f_bfree) * fs.f_frsize)

    try:
        result = warm.run(spec, on_line=on_line, should_cancel=lambda: False)
    finally:
        local.release_run_dir(run_dir)

    assert result.limit_exceeded == "disk", result
    assert result.error == "disk limit of 20 MiB reached (limits.disk_mb in worker.yml)"
    assert used, result
    assert used[0] <= 20 << 20


def test_a_recorded_module_that_runs_a_program_on_import_is_never_preloaded(
    tmp_path: Path,
) -> None:
    """What a recording run leaves is the worker's to write, and the warm process imports it
    as root with capabilities: only names of libraries pass, never a package's `__main__`
    (venv's makes environments, unittest's runs tests) nor CPython's test suite."""
    (tmp_path / RECORD_NAME).write_text(
        "json\n_json\nemail.mime.text\nvenv.__main__\nunittest.__main__\npip.__main__\n"
        "test.autotest\ntest\nantigravity\njson.__main__.x\nos; import x\n"
    )

    assert read_record(tmp_path) == ("json", "_json", "email.mime.text")
    assert not (tmp_path / RECORD_NAME).exists()


SCRATCH_SIZES = """
import json, os
sizes = {}
for path in ("/tmp", "/dev/shm"):
    found = os.statvfs(path)
    sizes[path] = found.f_blocks * found.f_frsize
print(json.dumps(sizes))
"""


def test_each_warm_run_gets_tmp_and_shm_of_its_own_memory_limit(warm: WarmedLocal) -> None:
    # Children are prepared with the size of the pool's last run mounted ahead: a run of
    # another size (here, the same pool) gets its own all the same.
    for memory_mb in (64, 64, 128, 128, 64):
        result, lines, _ = run(warm, SCRATCH_SIZES, memory_mb=memory_mb)
        assert result.exit_code == 0, lines
        expected = memory_mb * 1024 * 1024
        assert outputs(lines) == {"/tmp": expected, "/dev/shm": expected}, memory_mb


LAYERED = """
import json, os, shutil
from pathlib import Path
with open("data.txt", "a") as f:
    f.write("more\\n")
os.remove("keep.txt")
shutil.rmtree("sub")
os.mkdir("sub")
Path("sub/y.txt").write_text("y\\n")
os.rename("data.txt", "moved.txt")
print(json.dumps({
    "pid": os.getpid(),
    "moved": Path("moved.txt").read_text(),
    "keep": os.path.exists("keep.txt"),
    "sub": sorted(os.listdir("sub")),
}))
"""


def test_a_layered_warm_run_rewrites_removes_and_remakes_the_version_s_files_in_its_layer(
    warm: WarmedLocal,
) -> None:
    # The warm process mounts the overlay as root of its own user namespace, where the
    # version's files (root's on the host) are nobody's: writing one copies it up, removing
    # one or a folder of them leaves a whiteout or an opaque folder in the run's layer.
    files = warm.work_root / "versions" / "v1"
    (files / "sub").mkdir(parents=True)
    (files / "run.py").write_text(LAYERED)
    (files / "data.txt").write_text("original\n")
    (files / "keep.txt").write_text("k\n")
    (files / "sub" / "x.txt").write_text("shipped\n")
    run_dir = warm.work_root / "run-layered-1"
    warm.local.make_run_dir(run_dir, disk_mb=64)
    (run_dir / "work").mkdir()
    (run_dir / "output").mkdir()
    spec = SandboxSpec(
        run_id="run-layered",
        command=["python3", "run.py"],
        workdir=run_dir / "work",
        output_dir=run_dir / "output",
        files=files,
        timeout_seconds=30.0,
    )
    lines: Lines = []
    try:
        result = warm.run(
            spec, on_line=lambda *line: lines.append(line), should_cancel=lambda: False
        )
        assert result.exit_code == 0, lines
        seen = outputs(lines)
        assert seen == {"pid": 1, "moved": "original\nmore\n", "keep": False, "sub": ["y.txt"]}
        assert (files / "data.txt").read_text() == "original\n"
        assert (files / "sub" / "x.txt").read_text() == "shipped\n"
        assert (files / "keep.txt").exists()
    finally:
        warm.local.release_run_dir(run_dir)


MOUNT_FLAGS = """
import json
seen = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    seen[fields[4]] = sorted(fields[5].split(","))  # the last mount at a point is the run's
print(json.dumps({"pid": 1, **{p: seen[p] for p in ("/work", "/output", "/work/state.json")}}))
"""


def test_a_layered_warm_run_s_dirs_are_mounted_nosuid_and_nodev_as_a_cold_run_s(
    warm: WarmedLocal,
) -> None:
    # bubblewrap mounts a cold run's /work, /output and read-only files nosuid and nodev;
    # the warm child mounted the overlay and the read-only binds with neither.
    files = warm.work_root / "versions" / "v1"
    files.mkdir(parents=True)
    (files / "run.py").write_text(MOUNT_FLAGS)
    run_dir = warm.work_root / "run-flags-1"
    warm.local.make_run_dir(run_dir, disk_mb=64)
    (run_dir / "work").mkdir()
    (run_dir / "work" / "state.json").write_text("{}")
    (run_dir / "output").mkdir()
    spec = SandboxSpec(
        run_id="run-flags",
        command=["python3", "run.py"],
        workdir=run_dir / "work",
        output_dir=run_dir / "output",
        files=files,
        read_only=("state.json",),
        timeout_seconds=30.0,
    )
    lines: Lines = []
    try:
        result = warm.run(
            spec, on_line=lambda *line: lines.append(line), should_cancel=lambda: False
        )
        assert result.exit_code == 0, lines
        seen = outputs(lines)
        assert seen.pop("pid") == 1, "the run did not start warm"
        for point, flags in seen.items():
            assert {"nosuid", "nodev"} <= set(flags), (point, flags)  # type: ignore[call-overload]
        assert "ro" in seen["/work/state.json"]  # type: ignore[operator]
    finally:
        warm.local.release_run_dir(run_dir)


def _status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_the_warm_process_is_root_only_in_a_user_namespace_of_its_own(warm: WarmedLocal) -> None:
    # It imports modules a worker's cold run named: root there must be no root of the host.
    result, lines, spec = run(warm, 'import json, os\nprint(json.dumps({"uid": os.getuid()}))')
    assert result.exit_code == 0, lines
    key = warm.key(spec)
    assert key is not None
    process = warm.pools.process_of(key)
    assert process is not None
    host = os.readlink("/proc/self/ns/user")  # floom's own: the host's
    init = procfs.pid_of(process.init_pidfd)
    roots: set[int] = set()
    for pid in (process.pid, init):
        assert os.readlink(f"/proc/{pid}/ns/user") != host
        status = _status_of(pid)
        roots.update(int(uid) for uid in status["Uid"].split() + status["Gid"].split())
    # Its root is one host uid of the sandbox pool, which no run has.
    uids = warm.local._uids
    assert uids is not None
    (root,) = roots
    assert uids.uids.base <= root <= uids.uids.last
    assert outputs(lines)["uid"] not in (0, root)
    # bubblewrap, its one process in the host's namespace, runs as that uid with no capability.
    bwrap = _status_of(process.proc.pid)
    assert os.readlink(f"/proc/{process.proc.pid}/ns/user") == host
    assert {int(u) for u in bwrap["Uid"].split()} == {root}
    assert bwrap["Groups"].strip() == ""
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(bwrap[name], 16) == 0, (name, bwrap[name])
    # Its namespace maps no uid or gid of the host's but the pool's and nobody's (whom the
    # version's files belong to), and it may not change its groups.
    for name in ("uid_map", "gid_map"):
        for line in Path(f"/proc/{process.pid}/{name}").read_text().splitlines():
            _inside, outside, count = (int(n) for n in line.split())
            last = outside + count - 1
            pooled = uids.uids.base <= outside and last <= uids.uids.last
            assert pooled or (outside, count) == (65534, 1), (name, line)
    assert Path(f"/proc/{process.pid}/setgroups").read_text().strip() == "deny"
    # Its uid is given back once it has ended.
    warm.pools.close()
    assert root not in uids.held()


def _bubblewraps_of(token: str) -> list[tuple[int, str]]:
    """This process's bubblewrap children (zombies too) that carry `token`, or whose command
    line is gone (a zombie's): (pid, state) each."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
            if int(parent) != os.getpid() or "(bwrap)" not in stat:
                continue
            cmdline = (entry / "cmdline").read_bytes()
            if state == "Z" or token.encode() in cmdline:
                found.append((int(entry.name), state))
    return found


@pytest.mark.parametrize("starting", ["first", "successor"])
def test_closing_ends_a_warm_process_still_starting_before_it_returns(
    tmp_path: Path, starting: str
) -> None:
    # Every warm process takes a while to import: the node stops while a pool's first warm
    # process, or the successor started ahead of its recycling, is still starting.
    source = INSIDE.read_text().replace(
        '    _send(control, {"ready": True, "modules"',
        '    __import__("time").sleep(2.0)\n    _send(control, {"ready": True, "modules"',
    )
    assert source != INSIDE.read_text()
    warm = warmed_from(tmp_path, source, WarmSettings(recycle_runs=2, ready=1))
    local = warm.local
    token = warm.pools.token
    try:
        if starting == "first":
            # A cold run records what the version loads; its pool's warm process starts.
            spec = warm.warm_spec(warm_script_spec(warm.work_root, LOOK))
            result = local.run(spec, on_line=lambda *line: None, should_cancel=lambda: False)
            assert result.exit_code == 0
            wanted = 1
        else:
            result, lines, _ = run(warm, LOOK)
            assert result.exit_code == 0, lines
            wanted = 2  # the first one, and its successor
        wait_until(lambda: len(_bubblewraps_of(token)) >= wanted, interval=0.02)
    finally:
        warm.close()
    # Nothing of it is left: no bubblewrap running, and none unreaped.
    assert _bubblewraps_of(token) == []


def test_a_warm_process_slow_to_be_ready_is_given_up_on_without_waiting_on_its_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm process that has not said it is ready within START_SECONDS is given up on, its
    stderr's tail kept for the log. That tail was read with a blocking read of 4 KiB from a
    process still alive, its stderr open and nearly empty: the warm pools' thread waited
    for good (the process, ready later, never writes again nor ends)."""
    monkeypatch.setattr("floom.sandbox.local.warm.process.START_SECONDS", 0.5)
    source = INSIDE.read_text().replace(
        "    refused = _preload(modules)\n",
        "    import time as _t\n    _t.sleep(3)\n    refused = _preload(modules)\n",
    )
    assert source != INSIDE.read_text()
    local = LocalSandbox()
    launching = WarmProcess.launch(
        modules=(),
        owner=f"{warm_prefix(tmp_path)}slow",
        system_args=system_args(),
        source=source,
        uids=uids_of(local),
    )
    outcome: list[BaseException | WarmProcess] = []

    def await_ready() -> None:
        try:
            outcome.append(launching.ready())
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=await_ready, daemon=True)
    waiter.start()
    try:
        waiter.join(timeout=15)
        assert not waiter.is_alive(), "ready() still waits on the warm process's stderr"
        assert len(outcome) == 1, outcome
        assert isinstance(outcome[0], WarmUnavailable), outcome
        assert "no answer" in outcome[0].message
    finally:
        launching.abort()  # ends a process the waiter left (without the fix)
        waiter.join(timeout=15)
        local.close()
