"""One run cannot harm the node: per-run cgroup limits on the whole process tree, a polled
disk limit, an unprivileged uid without capabilities, and a seccomp filter."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.sandbox import LocalSandbox, SandboxResult
from floom.sandbox.local import cgroups, limits, seccomp
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run, wait_until
from tests.support.rigs.sandboxes import Lines
from tests.support.rigs.sandboxes import run_script as run_in_sandbox
from tests.support.stops import stop

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)

needs_cgroups = pytest.mark.skipif(
    not cgroups.detect().enforced, reason="no usable cgroup hierarchy on this node"
)


def run_script(
    tmp_path: Path,
    script: str,
    *,
    on_line: Callable[[str, str], None] | None = None,
    command: list[str] | None = None,
    sandbox: LocalSandbox | None = None,
    **limits: Any,
) -> tuple[SandboxResult, Lines]:
    return run_in_sandbox(
        sandbox or LocalSandbox(),
        tmp_path,
        script,
        on_line=on_line,
        command=command,
        **{"timeout_seconds": 60, **limits},
    )


def stdout(lines: Lines) -> list[str]:
    return [line for stream, line in lines if stream == "stdout"]


@needs_cgroups
def test_four_children_of_400_mib_end_the_run_with_the_memory_limit_error(tmp_path: Path) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import subprocess, sys
        child = "b = bytearray(400 * 1024 * 1024); print('child holds 400 MiB', flush=True)"
        children = [subprocess.Popen([sys.executable, "-c", child + "; input()"],
                                     stdin=subprocess.PIPE) for _ in range(4)]
        for c in children:
            c.wait()
        print("all four finished")
        """,
        memory_mb=512,
    )

    assert result.limit_exceeded == "memory", lines
    assert result.error == "memory limit of 512 MiB reached (limits.memory_mb in worker.yml)"
    assert "all four finished" not in stdout(lines)


@needs_cgroups
def test_tmpfs_and_shared_memory_count_toward_the_memory_limit(tmp_path: Path) -> None:
    # Each tmpfs alone may hold the whole limit; together with the process they exceed it.
    result, lines = run_script(
        tmp_path,
        """
        chunk = b"x" * (1024 * 1024)
        for path in ("/tmp/fill", "/dev/shm/fill"):
            with open(path, "wb") as fill:
                for _ in range(100):
                    fill.write(chunk)
        print("filled 200 MiB of tmpfs")
        """,
        memory_mb=128,
    )

    assert result.limit_exceeded == "memory", lines
    assert "filled 200 MiB of tmpfs" not in stdout(lines)


@needs_cgroups
def test_a_fork_bomb_is_bounded_by_the_process_limit_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    marker = f"fork-bomb-{uuid.uuid4().hex}"
    # The first shell stays (its `wait` could return before the bomb's descendants, left in
    # the background, reached the limit: the sandbox then ended with it, the limit unmet;
    # seen twice on a loaded machine). A fork refused at the limit, bash retries.
    result, lines = run_script(
        tmp_path,
        "",
        command=["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 30", marker],
        processes=32,
    )

    assert result.limit_exceeded == "processes", (result, lines[:5])
    assert result.error == "process limit of 32 reached (limits.processes in worker.yml)"
    left = {
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and _cmdline(pid).startswith(b"bash\0")
        and marker.encode() in _cmdline(pid)
    }
    assert not left


WRITE_30_MIB = """
import os
fd = os.open(os.environ["FLOOM_OUTPUT_DIR"], os.O_RDONLY)
for _ in range(NESTED):
    os.mkdir("x" * 250, dir_fd=fd)
    deeper = os.open("x" * 250, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = deeper
for name in ("a.bin", "b.bin"):
    out = os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd)
    os.write(out, os.urandom(15 * 1024 * 1024))
    os.close(out)
print("wrote 30 MiB")
"""


# Two files each under the per-file cap: only the polled total catches them. Under twenty
# folders of 250-character names, past PATH_MAX: a walk by whole paths could not look there,
# so what they held went uncounted.
@pytest.mark.parametrize("nested", [0, 20], ids=["in-the-output-dir", "past-path-max"])
def test_writing_past_the_disk_limit_ends_the_run_with_the_disk_limit_error(
    tmp_path: Path, nested: int
) -> None:
    result, lines = run_script(tmp_path, WRITE_30_MIB.replace("NESTED", str(nested)), disk_mb=20)

    assert result.limit_exceeded == "disk", lines
    assert result.error == "disk limit of 20 MiB reached (limits.disk_mb in worker.yml)"


def test_one_file_cannot_grow_past_the_disk_limit(tmp_path: Path) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import os
        with open("big.bin", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1024 * 1024))
                f.flush()
        print("wrote 64 MiB")
        """,
        disk_mb=16,
    )

    assert result.limit_exceeded == "disk", lines
    assert "wrote 64 MiB" not in stdout(lines)
    assert (tmp_path / "work" / "big.bin").stat().st_size <= 16 * 1024 * 1024


def test_folders_nested_past_the_disk_walk_s_depth_end_the_run(tmp_path: Path) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import os
        fd = os.open(".", os.O_RDONLY)
        for _ in range(300):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        print("nested")
        """,
    )

    assert result.limit_exceeded == "depth", (result, lines)
    assert result.error is not None
    assert "folders nested more than 256 deep" in result.error


def test_the_disk_walk_counts_to_its_depth_and_no_further(tmp_path: Path) -> None:
    for depth, counted in ((limits.MAX_DISK_DEPTH, True), (limits.MAX_DISK_DEPTH + 1, False)):
        top = tmp_path / f"top{depth}"
        top.mkdir()
        fd = os.open(top, os.O_RDONLY)
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(fd)
        use = limits.allocated_bytes((top,))
        if counted:
            assert use.uncounted is None
            assert use.bytes > 0
        else:
            assert use.uncounted == limits.DEPTH


def _counted_as_nobody(top: Path) -> str:
    """limits.allocated_bytes of `top` in a child process under uid 65534: a floom of a
    plain user, whose sandboxes run under its own uid."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            use = limits.allocated_bytes((top,))
            said = use.uncounted or str(use.bytes)
            os.write(write_fd, said.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        said = os.read(read_fd, 1024).decode()
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    return said


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
@pytest.mark.parametrize("mode", [0o000, 0o444], ids=["no-rights", "listable-only"])
def test_a_folder_its_run_made_unreadable_is_refused_by_the_disk_walk_not_skipped(
    mode: int,
) -> None:
    # Without root, floom and its sandboxes share a uid: a run can take its own rights away
    # from a folder, and a walk that skipped what it could not read counted nothing there.
    base = Path(tempfile.mkdtemp(prefix="floom-unreadable-"))
    try:
        base.chmod(0o755)
        hidden = base / "work" / "hidden"
        hidden.mkdir(parents=True)
        (hidden / "big.bin").write_bytes(os.urandom(1024 * 1024))
        for path in (base / "work", hidden, hidden / "big.bin"):
            os.chown(path, 65534, 65534)
        assert int(_counted_as_nobody(base / "work")) >= 1024 * 1024

        hidden.chmod(mode)

        assert _counted_as_nobody(base / "work") == limits.UNREADABLE
    finally:
        subprocess.run(["rm", "-rf", "--", str(base)], check=False)


LIMITS_SEEN = """
import json, resource
names = ("RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_DATA")
print(json.dumps({name: resource.getrlimit(getattr(resource, name)) for name in names}))
"""


@pytest.mark.parametrize("memory_cgroup", [True, False])
def test_the_per_process_limits_are_set_soft_and_hard_before_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_cgroup: bool
) -> None:
    # The launcher's shell sets them (ulimit) and bwrap keeps them: each file's size in
    # bytes (the shell counts 512-byte blocks), no core files, and where no memory cgroup
    # holds the run, the data segment (the shell counts KiB). Hard as soft: the sandbox
    # cannot raise them.
    if memory_cgroup and cgroups.MEMORY not in cgroups.detect().enforced:
        pytest.skip("no memory cgroup here")
    if not memory_cgroup:
        monkeypatch.setattr(cgroups, "detect", lambda: cgroups.CgroupTree(version=1, parents={}))
    result, lines = run_script(tmp_path, LIMITS_SEEN, disk_mb=24, memory_mb=96)

    assert result.exit_code == 0, lines
    seen = json.loads(stdout(lines)[-1])
    assert seen["RLIMIT_FSIZE"] == [24 << 20, 24 << 20]
    assert seen["RLIMIT_CORE"] == [0, 0]
    if not memory_cgroup:
        assert seen["RLIMIT_DATA"] == [96 << 20, 96 << 20]
    else:
        assert seen["RLIMIT_DATA"] != [96 << 20, 96 << 20]


def test_more_files_than_the_disk_check_counts_end_the_run(tmp_path: Path) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import os
        out = os.environ["FLOOM_OUTPUT_DIR"]
        for i in range(100_001):
            open(os.path.join(out, str(i)), "w").close()
        print("made them all")
        """,
    )

    assert result.limit_exceeded == "files", (result, lines)
    assert result.error is not None
    assert "file limit of 100000" in result.error


@needs_cgroups
def test_a_cpu_limit_of_half_a_core_throttles_two_busy_processes(tmp_path: Path) -> None:
    # Other tests may load this machine, so CPU time per wall second alone proves little:
    # the run's cgroup must also report throttling while it runs.
    cpu_parent = cgroups.detect().parents.get(cgroups.CPU)
    if cpu_parent is None:
        pytest.skip("the cpu controller is not usable here")
    marker = f"cpu-probe-{uuid.uuid4().hex[:8]}"
    throttled: list[int] = []

    def sample_the_runs_cgroup(stream: str, line: str) -> None:
        if line != "ready":
            return
        [name] = _run_cgroup_names(_host_cgroups(marker))
        stat = cpu_parent / name / "cpu.stat"
        # At least ten 100 ms quota periods, so start-up bursts do not decide the measure.
        wait_until(lambda: _counter(stat, "nr_periods") >= 10, timeout=20)
        throttled.append(wait_until(lambda: _counter(stat, "nr_throttled"), timeout=20))
        (tmp_path / "work" / "stop").write_text("")

    result, lines = run_script(
        tmp_path,
        """
        import os, resource, subprocess, sys, time
        busy = ("import os, time\\nend = time.monotonic() + 20\\n"
                "while not os.path.exists('stop') and time.monotonic() < end: pass")
        start = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
        print("ready", flush=True)
        for p in procs:
            p.wait()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"{(used.ru_utime + used.ru_stime) / (time.monotonic() - start):.3f}")
        """,
        cpu=0.5,
        on_line=sample_the_runs_cgroup,
        command=["python3", "run.py", marker],
    )

    assert result.exit_code == 0, lines
    assert throttled
    assert throttled[0] > 0
    cores = float(stdout(lines)[-1])
    assert cores < 0.75, f"used {cores} cores"


def test_the_sandbox_runs_as_an_unprivileged_host_uid_without_capabilities(
    tmp_path: Path,
) -> None:
    marker = f"uid-probe-{uuid.uuid4().hex}"
    host_status: dict[str, str] = {}

    def inspect_from_the_host(stream: str, line: str) -> None:
        if line != "ready":
            return
        for pid in os.listdir("/proc"):
            if pid.isdigit() and _is_probe(pid, marker):
                host_status.update(_status(pid))
        (tmp_path / "work" / "go").write_text("")

    result, lines = run_script(
        tmp_path,
        """
        import os, time
        print(os.getuid())
        print([l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0])
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)
        """,
        command=["python3", "run.py", marker],
        on_line=inspect_from_the_host,
    )

    assert result.exit_code == 0, lines
    uid_inside, caps_inside, _ = stdout(lines)
    assert uid_inside != "0"
    assert int(caps_inside, 16) == 0
    assert host_status, "the sandbox's process was not found on the host"
    assert host_status["Uid"].split()[0] != "0"
    assert int(host_status["CapEff"], 16) == 0


def test_io_uring_ptrace_keyrings_and_bpf_are_refused_with_eperm(tmp_path: Path) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import ctypes, errno, platform
        libc = ctypes.CDLL(None, use_errno=True)
        numbers = {
            "x86_64": {"io_uring_setup": 425, "ptrace": 101, "keyctl": 250, "bpf": 321},
            "aarch64": {"io_uring_setup": 425, "ptrace": 117, "keyctl": 219, "bpf": 280},
        }[platform.machine()]
        params = ctypes.create_string_buffer(120)
        args = {
            "io_uring_setup": (8, params),
            "ptrace": (0, 0, 0, 0),  # PTRACE_TRACEME
            "keyctl": (0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
            "bpf": (0, params, 72),  # BPF_MAP_CREATE
        }
        for name, number in numbers.items():
            rv = libc.syscall(number, *args[name])
            code = ctypes.get_errno() if rv == -1 else 0
            print(name, errno.errorcode.get(code, "ok"))
        """,
    )

    assert result.exit_code == 0, lines
    assert sorted(stdout(lines)) == [
        "bpf EPERM",
        "io_uring_setup EPERM",
        "keyctl EPERM",
        "ptrace EPERM",
    ]


def test_sockets_of_families_other_than_unix_ip_and_netlink_routing_are_refused(
    tmp_path: Path,
) -> None:
    result, lines = run_script(
        tmp_path,
        """
        import errno, socket
        tried = {
            "unix": (1, 1, 0), "inet": (2, 2, 0), "inet6": (10, 2, 0),
            "netlink-route": (16, 3, 0),
            "vsock": (40, 1, 0), "packet": (17, 3, 0), "xdp": (44, 3, 0),
            "netlink-uevent": (16, 3, 15), "netlink-sock-diag": (16, 3, 4),
            "netlink-audit": (16, 3, 9), "netlink-generic": (16, 3, 16),
            "alg": (38, 5, 0), "key": (15, 3, 2),
        }
        for name, (family, kind, protocol) in tried.items():
            try:
                socket.socket(family, kind, protocol).close()
                print(name, "ok")
            except OSError as exc:
                print(name, errno.errorcode[exc.errno])
        try:
            socket.socketpair(40, 1).close()
            print("socketpair-vsock ok")
        except OSError as exc:
            print("socketpair-vsock", errno.errorcode[exc.errno])
        """,
    )

    assert result.exit_code == 0, lines
    seen = dict(line.split() for line in stdout(lines))
    assert {name: seen.pop(name) for name in ("unix", "inet", "inet6", "netlink-route")} == {
        "unix": "ok",
        "inet": "ok",
        "inet6": "ok",
        "netlink-route": "ok",
    }
    assert seen == dict.fromkeys(seen, "EAFNOSUPPORT")
    assert len(seen) == 10


@needs_cgroups
@pytest.mark.parametrize(
    "switched",
    [
        pytest.param(True, id="the-default-uids"),
        # Started as floom's own uid there is no stage between the launcher and bwrap.
        pytest.param(False, id="floom-s-own-uid"),
    ],
)
def test_the_run_is_in_its_own_cgroup_which_is_removed_after_the_run(
    tmp_path: Path, switched: bool
) -> None:
    # Read from the host while the run waits: inside, its cgroup namespace may show its own
    # cgroup as "/".
    marker = f"cgroup-probe-{uuid.uuid4().hex[:8]}"
    seen: list[list[str]] = []

    def on_line(_stream: str, line: str) -> None:
        if line == "ready":
            seen.extend(_host_cgroups(marker))
            (tmp_path / "output" / "go").write_text("")

    sandbox = LocalSandbox() if switched else LocalSandbox(uids=None)
    result, lines = run_script(
        tmp_path,
        """
        import os, time
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while not os.path.exists("/output/go") and time.monotonic() < deadline:
            time.sleep(0.01)
        """,
        command=["python3", "run.py", marker],
        on_line=on_line,
        sandbox=sandbox,
    )
    # Removed by the run's release, off the run's path (floom/sandbox/releases.py).
    assert sandbox.releases.drain()

    assert result.exit_code == 0, lines
    assert seen, "no process of the run was found from the host"
    names = _run_cgroup_names(seen)
    assert len(names) == 1, seen
    [name] = names
    hierarchies = len(set(cgroups.detect().parents.values()))
    for found in seen:  # bwrap, the sandbox's pid 1 and the command: in every hierarchy
        assert sum(line.endswith(f"/floom/{name}") for line in found) == hierarchies, found
    for parent in cgroups.detect().parents.values():
        assert not (parent / name).exists()


@needs_cgroups
def test_empty_run_cgroups_a_dead_floom_left_are_removed_and_busy_ones_stay() -> None:
    # Under a parent of its own, so other floom processes' cgroups on this node are safe.
    tree = cgroups.detect()
    sub = f"stale-test-{uuid.uuid4().hex[:8]}"
    own = cgroups.CgroupTree(
        version=tree.version, parents={k: p / sub for k, p in tree.parents.items()}
    )
    for parent in set(own.parents.values()):
        parent.mkdir()
    limits = cgroups.CgroupLimits(memory_bytes=64 << 20, processes=16, cpu_cores=1)
    left_empty = own.create("left-empty", limits)
    busy = own.create("busy", limits)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        busy.add(sleeper.pid)

        removed = cgroups.remove_stale(own, older_than=0)

        assert removed == len(set(left_empty.dirs.values()))
        assert not any(path.exists() for path in left_empty.dirs.values())
        assert all(path.exists() for path in busy.dirs.values())
    finally:
        sleeper.kill()
        sleeper.wait()
        busy.remove()
        for parent in set(own.parents.values()):
            parent.rmdir()


def test_a_cgroup_v2_run_group_kills_its_processes_and_goes_away() -> None:
    # This node's v2 hierarchy holds no controllers, but killing and removal are the same.
    mounts = [
        m for m in Path("/proc/self/mountinfo").read_text().splitlines() if " - cgroup2 " in m
    ]
    if not mounts or os.geteuid() != 0:
        pytest.skip("no cgroup v2 hierarchy to write to")
    path = Path(mounts[0].split()[4]) / f"floom-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    group = cgroups.RunCgroup(version=2, dirs={cgroups.MEMORY: path})
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        group.add(sleeper.pid)
        assert group.pids() == {sleeper.pid}

        assert group.remove()

        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not path.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        if path.exists():
            path.rmdir()


def test_healthz_lists_the_sandbox_protections_of_this_node_and_its_ready_backends(
    server: LiveServer,
) -> None:
    body = httpx.get(f"{server.base_url}/healthz", timeout=10).json()

    assert body["sandboxes"]["local"] == "ready"
    assert body["sandboxes"]["e2b"] == "ready" or "FLOOM_E2B_API_KEY" in body["sandboxes"]["e2b"]

    protections = body["protections"]
    assert protections["namespaces"] is True
    assert protections["seccomp"] is True
    assert protections["unprivileged_uid"] is True
    assert protections["cgroup"] in ("v1", "v2", "none")
    for key in ("memory_limit", "process_limit", "cpu_limit", "disk_limit", "network"):
        assert key in protections


@needs_cgroups
def test_a_run_that_reaches_its_memory_limit_says_so_through_the_api(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "hog",
        "name: hog\nlimits: {memory_mb: 128}\n",
        {
            "run.py": "import subprocess, sys\n"
            "code = 'b = bytearray(100 * 1024 * 1024); input()'\n"
            "ps = [subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.PIPE)"
            " for _ in range(3)]\n"
            "[p.wait() for p in ps]\n"
        },
    )
    deploy_folder(api, folder)
    run = api.post("/api/v1/workers/hog/runs", json={"inputs": {}}).json()

    done = wait_for_run(api, run["id"], timeout=60)

    assert done["status"] == "limit_exceeded", done
    assert done["error"]["code"] == "limit_exceeded", done
    assert "memory limit of 128 MiB reached (limits.memory_mb in worker.yml)" in str(
        done.get("error")
    ), done


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_probe(pid: str, marker: str) -> bool:
    """Whether `pid` is the worker's python process (bwrap's own argv holds the marker too)."""
    cmdline = _cmdline(pid)
    return cmdline.startswith(b"python3\0") and marker.encode() in cmdline


def _host_cgroups(marker: str) -> list[list[str]]:
    """/proc/PID/cgroup, read from the host, of each process whose argv holds `marker` (bwrap,
    the sandbox's pid 1 and the command): inside, the run's cgroup namespace may show its
    own cgroup as "/"."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and marker.encode() in _cmdline(pid):
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{pid}/cgroup").read_text().splitlines())
    return found


def _run_cgroup_names(seen: list[list[str]]) -> set[str]:
    return {line.rsplit("/", 1)[1] for found in seen for line in found if "/floom/" in line}


def _counter(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _status(pid: str) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def test_a_stopped_sandbox_pid_1_does_not_turn_a_finished_run_into_a_timeout(
    tmp_path: Path,
) -> None:
    marker = f"stop-probe-{uuid.uuid4().hex}"
    stopped: list[int] = []

    def stop_pid_1_from_the_host(stream: str, line: str) -> None:
        if line != "ready":
            return
        [command] = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_probe(pid, marker)]
        init = int(_status(command)["PPid"])
        stop(init)  # stopped indeed before the script may end: else pid 1 reaps it
        stopped.append(init)
        (tmp_path / "work" / "go").write_text("")

    started = time.monotonic()
    result, lines = run_script(
        tmp_path,
        """
        import os, sys, time
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(7)
        """,
        command=["python3", "run.py", marker],
        on_line=stop_pid_1_from_the_host,
        timeout_seconds=30,
    )

    assert stopped
    assert not result.timed_out, lines
    assert result.exit_code == 7, result
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("machine", "audit_arch", "refused", "allowed"),
    [
        ("x86_64", 0xC000003E, {"ptrace": 101, "io_uring_setup": 425, "bpf": 321}, (0, 1, 59)),
        ("aarch64", 0xC00000B7, {"ptrace": 117, "io_uring_setup": 425, "bpf": 280}, (63, 64, 221)),
    ],
)
def test_the_seccomp_filter_of_each_architecture_refuses_its_own_syscall_numbers(
    machine: str, audit_arch: int, refused: dict[str, int], allowed: tuple[int, ...]
) -> None:
    # The filter is run here by a small classic-BPF interpreter, so the table of an
    # architecture this machine is not is checked too.
    program = seccomp.deny_filter(machine)
    eperm = 0x00050000 | errno.EPERM
    allow = 0x7FFF0000

    for number in refused.values():
        assert _run_bpf(program, nr=number, arch=audit_arch) == eperm
    for number in allowed:  # read/write/execve, or their aarch64 twins
        assert _run_bpf(program, nr=number, arch=audit_arch) == allow
    assert _run_bpf(program, nr=allowed[0], arch=0x40000003) == eperm  # i386 compat calls
    if machine == "x86_64":
        assert _run_bpf(program, nr=0x40000000 | allowed[0], arch=audit_arch) == eperm  # x32


@pytest.mark.parametrize(
    ("machine", "audit_arch", "socket_calls"),
    [
        ("x86_64", 0xC000003E, (41, 53)),
        ("aarch64", 0xC00000B7, (198, 199)),
    ],
)
def test_the_seccomp_filter_of_each_architecture_lets_sockets_of_four_families_alone(
    machine: str, audit_arch: int, socket_calls: tuple[int, int]
) -> None:
    program = seccomp.deny_filter(machine)
    allow = 0x7FFF0000
    no_family = 0x00050000 | errno.EAFNOSUPPORT
    for nr in socket_calls:  # socket, socketpair
        for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6
            assert _run_bpf(program, nr=nr, arch=audit_arch, args=(family, 1, 0)) == allow
        # AF_NETLINK: the routing protocol only.
        assert _run_bpf(program, nr=nr, arch=audit_arch, args=(16, 3, 0)) == allow
        for protocol in (4, 9, 15, 16):  # sock_diag, audit, uevents, generic
            refused = _run_bpf(program, nr=nr, arch=audit_arch, args=(16, 3, protocol))
            assert refused == no_family
        for family in (0, 3, 15, 17, 38, 40, 44, 45, 255, 1 << 16):
            assert _run_bpf(program, nr=nr, arch=audit_arch, args=(family, 1, 0)) == no_family
        # Only the int the kernel reads counts: high bits of the register change nothing.
        assert _run_bpf(program, nr=nr, arch=audit_arch, args=(40 | 2 << 32, 1, 0)) == no_family
        assert _run_bpf(program, nr=nr, arch=audit_arch, args=(2 | 40 << 32, 1, 0)) == allow


def _run_bpf(
    program: bytes, *, nr: int, arch: int, args: tuple[int, ...] = (0, 0, 0, 0, 0, 0)
) -> int:
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args, *(0,) * (6 - len(args)))
    pc = 0
    accumulator = 0
    while True:
        code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
        if code == 0x20:  # ld [k]
            accumulator = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35):  # jeq / jge
            hit = accumulator == k if code == 0x15 else accumulator >= k
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:  # ret k
            return int(k)
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_a_floom_that_is_not_root_runs_sandboxes_as_its_own_uid(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start the non-root floom")
    uid = 1000
    probe = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from floom.sandbox import LocalSandbox, SandboxSpec
        sandbox = LocalSandbox()
        print(sandbox.protections()["sandbox_uid"])
        result = sandbox.run(
            SandboxSpec(run_id="non-root", command=["sh", "-c", "id -u"],
                        workdir=Path(sys.argv[1]), output_dir=Path(sys.argv[2])),
            on_line=lambda stream, line: print(stream, line), should_cancel=lambda: False,
        )
        print("exit", result.exit_code)
        """
    )
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": f"{Path(__file__).resolve().parents[3]}:{site}",
    }
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    python = next(
        (
            exe
            for exe in (
                sys.executable,
                f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
            )
            if subprocess.run([*as_user, exe, "-c", "import floom.sandbox"], env=env).returncode
            == 0
        ),
        None,
    )
    if python is None:
        pytest.skip(f"no Python that uid {uid} can run with floom importable")
    # pytest's own tmp dirs sit under a directory only root may enter.
    home = Path(tempfile.mkdtemp(prefix="floom-non-root-"))
    try:
        os.chmod(home, 0o755)
        for name in ("work", "output"):
            (home / name).mkdir()
            os.chown(home / name, uid, uid)

        done = subprocess.run(
            [*as_user, python, "-c", probe, str(home / "work"), str(home / "output")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(home)

    assert done.stdout.splitlines() == [str(uid), f"stdout {uid}", "exit 0"], done.stderr


CPU_GROUP_LIMITS = cgroups.CgroupLimits(memory_bytes=64 << 20, processes=64, cpu_cores=1)


@pytest.fixture
def own_cpu_group() -> Iterator[tuple[cgroups.CgroupTree, Path]]:
    """A CPU group of the test's own under floom/, standing for floom/ itself (the real one
    is shared with the servers other tests start at the same time), and a tree of run
    cgroups under it."""
    tree = cgroups.detect()
    if cgroups.CPU not in tree.enforced:
        pytest.skip("no CPU controller here")
    parent = tree.parents[cgroups.CPU] / f"weigh-test-{uuid.uuid4().hex[:8]}"
    parent.mkdir()
    try:
        yield cgroups.CgroupTree(version=tree.version, parents={cgroups.CPU: parent}), parent
    finally:
        parent.rmdir()


def _weight_file(tree: cgroups.CgroupTree) -> tuple[str, int]:
    """The group's weight file and one process's weight in it."""
    if tree.version == 2:
        return "cpu.weight", cgroups.DEFAULT_CPU_WEIGHT_V2
    return "cpu.shares", cgroups.DEFAULT_CPU_SHARES_V1


@needs_cgroups
def test_the_runs_cpu_group_weighs_as_many_processes_as_it_holds_runs(
    own_cpu_group: tuple[cgroups.CgroupTree, Path],
) -> None:
    # Under CPU contention the kernel shares CPU between sibling groups by weight: with the
    # default (one process's), all of a node's runs together got one process's CPU time.
    own, parent = own_cpu_group
    name, one = _weight_file(own)

    def weight() -> int:
        return int((parent / name).read_text())

    first = own.create("run-a", CPU_GROUP_LIMITS)
    assert weight() == one
    second = own.create("run-b", CPU_GROUP_LIMITS)
    assert weight() == 2 * one
    first.remove()
    assert weight() == one
    second.remove()
    assert weight() == one


@needs_cgroups
def test_runs_one_at_a_time_never_rewrite_the_cpu_groups_weight(
    own_cpu_group: tuple[cgroups.CgroupTree, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One live run weighs as one process, as no run does: nothing to write at its start
    # and end.
    own, parent = own_cpu_group
    name, _ = _weight_file(own)
    written: list[str] = []
    real_write = cgroups._write

    def write(path: str, value: str) -> None:
        if path == f"{parent}/{name}":
            written.append(value)
        real_write(path, value)

    monkeypatch.setattr(cgroups, "_write", write)
    own.create("run-a", CPU_GROUP_LIMITS).remove()  # the group's first run: its weight is set
    written.clear()
    for n in range(3):
        own.create(f"run-{n}", CPU_GROUP_LIMITS).remove()
    assert written == []
    both = [own.create("run-x", CPU_GROUP_LIMITS), own.create("run-y", CPU_GROUP_LIMITS)]
    for run in both:
        run.remove()
    assert len(written) == 2  # two runs at once, then one again


# A run dir with a disk of its own (a root floom's, floom/sandbox/local/disks.py): the kernel
# bounds what the run writes, whatever it tries. Each trick writes until the kernel refuses
# (ENOSPC), says FULL, and holds what it has; the polled walk of a plain run dir missed the
# first (the host lost 950 MiB under disk_mb: 20) and stopped short on the deep tree.
FILL = """
import errno, os, sys, time
def fill(fd, size):
    while size > 0:
        size -= os.write(fd, b"x" * min(size, 1 << 20))
def full(exc):
    if exc.errno != errno.ENOSPC:
        raise exc
    print("FULL", flush=True)
    time.sleep(60)
    sys.exit(0)
"""
DISK_TRICKS = {
    "unlinked-while-open": """
held = []
try:
    for i in range(50):
        fd = os.open(f"u{i}", os.O_CREAT | os.O_WRONLY, 0o600)
        os.unlink(f"u{i}")
        held.append(fd)
        fill(fd, 19 << 20)
except OSError as exc:
    full(exc)
""",
    "sparse": """
fd = os.open("sparse.bin", os.O_CREAT | os.O_WRONLY, 0o600)
os.ftruncate(fd, 1 << 30)
try:
    for offset in range(0, 1 << 30, 1 << 20):
        os.pwrite(fd, b"x" * (256 << 10), offset)
except OSError as exc:
    full(exc)
""",
    "hard-links": """
try:
    fd = os.open("a", os.O_CREAT | os.O_WRONLY, 0o600)
    fill(fd, 1 << 20)
    for i in range(200):
        os.link("a", f"link{i}")
        fd = os.open(f"link{i}", os.O_WRONLY | os.O_APPEND)
        fill(fd, 1 << 20)
        os.close(fd)
except OSError as exc:
    full(exc)
""",
    "many-small-files": """
out = os.environ["FLOOM_OUTPUT_DIR"]
try:
    for i in range(100_000):
        fd = os.open(os.path.join(out, str(i)), os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
except OSError as exc:
    full(exc)
""",
    "deep-tree": """
fd = os.open(".", os.O_RDONLY)
for _ in range(300):
    os.mkdir("d", dir_fd=fd)
    deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = deeper
try:
    for i in range(100):
        out = os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
        fill(out, 1 << 20)
        os.close(out)
except OSError as exc:
    full(exc)
""",
    "overlay-copy-ups": """
try:
    for name in sorted(n for n in os.listdir(".") if n.startswith("version-")):
        with open(name, "ab") as f:
            f.write(b"x")
except OSError as exc:
    full(exc)
""",
}


def needs_disks() -> LocalSandbox:
    sandbox = LocalSandbox()
    if sandbox.disks is None or not sandbox.disks.usable():
        pytest.skip("a run's own disk needs root and loop devices")
    return sandbox


@pytest.mark.parametrize("trick", list(DISK_TRICKS))
def test_no_file_trick_writes_past_the_run_s_own_disk(tmp_path: Path, trick: str) -> None:
    sandbox = needs_disks()
    run_dir = tmp_path / "run"
    sandbox.make_run_dir(run_dir, disk_mb=20)
    files = tmp_path / "version"
    files.mkdir()
    for i in range(12):  # each copied up into the run's layer when written to
        (files / f"version-{i:02}").write_bytes(os.urandom(2 << 20))
    seen: dict[str, int] = {}

    def on_line(stream: str, line: str) -> None:
        if line == "FULL":
            disk = sandbox.disks.disk_of(run_dir) if sandbox.disks else None
            assert disk is not None
            image, fs = os.stat(disk.image), os.statvfs(run_dir)
            seen["image_size"] = image.st_size
            seen["image_allocated"] = image.st_blocks * 512
            seen["used"] = (fs.f_blocks - fs.f_bfree) * fs.f_frsize

    try:
        result, lines = run_script(
            run_dir,
            FILL + DISK_TRICKS[trick],
            on_line=on_line,
            sandbox=sandbox,
            disk_mb=20,
            files=files,
        )
    finally:
        sandbox.release_run_dir(run_dir)
        sandbox.close()

    assert result.limit_exceeded == "disk", (result, lines)
    assert result.error == "disk limit of 20 MiB reached (limits.disk_mb in worker.yml)"
    # While it held what it wrote, the host's disk held at most the 20 MiB of its image.
    assert seen["image_size"] == 20 << 20, seen
    assert seen["image_allocated"] <= 20 << 20, seen
    assert seen["used"] <= 20 << 20, seen


def test_a_run_s_disk_goes_with_its_run_dir(tmp_path: Path) -> None:
    sandbox = needs_disks()
    run_dir = tmp_path / "run"
    sandbox.make_run_dir(run_dir, disk_mb=8)
    disk = sandbox.disks.disk_of(run_dir) if sandbox.disks else None
    assert disk is not None
    assert os.path.ismount(run_dir)
    backing = Path(f"/sys/block/{Path(disk.device).name}/loop/backing_file")
    assert backing.read_text().strip() == str(disk.image)
    try:
        result, lines = run_script(run_dir, "open('result.json', 'w').write('{}')", sandbox=sandbox)
        assert result.exit_code == 0, lines
        # What the run left is in the host paths until the run dir is let go of.
        assert (run_dir / "work" / "result.json").read_text() == "{}"
    finally:
        sandbox.release_run_dir(run_dir)
        sandbox.close()

    assert not os.path.ismount(run_dir)
    assert os.listdir(run_dir) == []
    wait_until(lambda: not disk.image.exists())
    # Its loop device was cleared with its last mount (or serves another disk now).
    wait_until(
        lambda: not backing.exists() or backing.read_text().strip() != str(disk.image),
        timeout=10,
    )


def test_a_disk_let_go_of_while_the_disks_thread_idles_is_closed(tmp_path: Path) -> None:
    # The disks thread sleeps until told once its ready disks are made; a disk let go of
    # then must wake it (it is woken only when its work comes sooner than it sleeps to).
    sandbox = needs_disks()
    disks = sandbox.disks
    assert disks is not None
    try:
        run_dir = tmp_path / "run"
        sandbox.make_run_dir(run_dir, disk_mb=8)
        disk = disks.disk_of(run_dir)
        assert disk is not None
        wait_until(lambda: disks.waiting(8) >= 2, timeout=10)  # made ahead: now it idles
        sandbox.release_run_dir(run_dir)
        wait_until(lambda: not disk.image.exists(), timeout=10)
    finally:
        sandbox.close()


def test_the_sandbox_s_mount_table_names_no_host_path(tmp_path: Path) -> None:
    sandbox = needs_disks()
    run_dir = tmp_path / "run"
    sandbox.make_run_dir(run_dir, disk_mb=16)
    files = tmp_path / "version"
    files.mkdir()
    (files / "run.py").write_text("print(open('/proc/self/mountinfo').read())\n")
    try:
        result, lines = run_script(
            run_dir, (files / "run.py").read_text(), sandbox=sandbox, files=files
        )
    finally:
        sandbox.release_run_dir(run_dir)
        sandbox.close()

    assert result.exit_code == 0, lines
    table = "\n".join(stdout(lines))
    assert " /work " in table
    assert " /output " in table
    for host_path in {str(tmp_path), os.path.realpath(tmp_path)}:
        assert host_path not in table, table
    for line in table.splitlines():
        fields = line.split()
        if fields and fields[4] in ("/work", "/output"):
            # Roots inside the run's own disk; the overlay's layers by the stage's names.
            assert fields[3] in ("/", "/output"), line
            assert all(
                option.partition("=")[2].startswith("/run/floom-sandbox/")
                for option in fields[-1].split(",")
                if option.startswith(("lowerdir=", "upperdir=", "workdir="))
            ), line


def test_protections_say_whether_the_kernel_or_a_poll_bounds_the_disk() -> None:
    sandbox = LocalSandbox()
    enforced = sandbox.disks is not None and sandbox.disks.usable()
    assert sandbox.protections()["disk_limit"] == ("enforced" if enforced else "polled")
    if os.geteuid() == 0:
        assert enforced == bool(os.path.exists("/dev/loop-control") and shutil.which("mkfs.ext4"))
    # Sandboxes under floom's own uid have no stage to mount a disk on: polled.
    own = LocalSandbox(uids=None)
    assert own.disks is None
    assert own.protections()["disk_limit"] == "polled"
    sandbox.close()
    own.close()
