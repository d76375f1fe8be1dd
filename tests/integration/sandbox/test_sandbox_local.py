"""The local bubblewrap sandbox, run for real: isolation, streaming, limits and clean-up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.errors import InvalidRequest
from floom.sandbox import LocalSandbox, SandboxResult, SandboxSpec, get_sandbox
from floom.sandbox.local.backend import (
    MAX_LINE_BYTES,
    SANDBOX_OUTPUT_DIR,
    SandboxUnavailable,
    owner_marker,
)
from tests.support.harness import wait_until
from tests.support.rigs.sandboxes import Lines, run_script

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)


# A worker that starts a grandchild in its own session (stdio detached, so it holds none of
# the sandbox's pipes), waits until it runs, says "ready", then sleeps.
GRANDCHILD_WORKER = """
import os, subprocess, sys, time
subprocess.Popen(
    [sys.executable, "-c", "import time; open('/tmp/started', 'w').close(); time.sleep(1000)",
     os.environ["MARKER"]],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
deadline = time.monotonic() + 10
while not os.path.exists("/tmp/started"):
    if time.monotonic() > deadline:
        sys.exit("the grandchild never started")
    time.sleep(0.01)
print("ready")
time.sleep(1000)
"""


@pytest.fixture
def sandbox() -> LocalSandbox:
    return LocalSandbox()


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def stream(lines: Lines, name: str) -> list[str]:
    return [line for stream_name, line in lines if stream_name == name]


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (the sandbox's pids are visible here)."""
    needle = marker.encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue  # it ended while we looked
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def test_runs_a_python_script_and_streams_each_stream_in_order(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "inputs.json").write_text('{"n": 3}')
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import json, os, socket, sys
        n = json.load(open("inputs.json"))["n"]
        for i in range(n):
            print(f"out {i}")
            print(f"err {i}", file=sys.stderr)
        print("cwd", os.getcwd(), "host", socket.gethostname())
        sys.stdout.write("no newline at the end")
        """,
    )

    assert result == SandboxResult(exit_code=0)
    assert stream(lines, "stdout") == [
        "out 0",
        "out 1",
        "out 2",
        "cwd /work host floom",
        "no newline at the end",
    ]
    assert stream(lines, "stderr") == ["err 0", "err 1", "err 2"]


def test_the_exit_code_of_the_process_is_reported(sandbox: LocalSandbox, tmp_path: Path) -> None:
    result, _ = run_script(sandbox, tmp_path, "raise SystemExit(7)")

    assert result == SandboxResult(exit_code=7)


def test_output_lines_arrive_while_the_process_is_still_running(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    # The worker exits 0 only if the test answers its first line while it still runs.
    def answer(stream: str, line: str) -> None:
        if line == "waiting for go":
            (tmp_path / "work" / "go").touch()

    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import os, sys, time
        print("waiting for go")
        deadline = time.monotonic() + 10
        while not os.path.exists("go"):
            if time.monotonic() > deadline:
                sys.exit("no go within 10 s: the line was not streamed")
            time.sleep(0.01)
        print("went")
        """,
        on_line=answer,
    )

    assert result.exit_code == 0, lines
    assert stream(lines, "stdout") == ["waiting for go", "went"]


def test_long_lines_are_capped_with_a_marker_and_bad_utf8_is_replaced(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    result, lines = run_script(
        sandbox,
        tmp_path,
        f"""
        import sys
        print("x" * {MAX_LINE_BYTES * 3})
        sys.stdout.flush()
        sys.stdout.buffer.write(b"bad \\xff byte\\r\\n")
        print("next")
        """,
    )

    assert result.exit_code == 0
    long_line, bad, after = stream(lines, "stdout")
    assert long_line.startswith("x" * MAX_LINE_BYTES)
    assert long_line[MAX_LINE_BYTES:] == f" [line truncated at {MAX_LINE_BYTES} bytes]"
    assert bad == "bad \ufffd byte"
    assert after == "next"


def test_the_process_sees_only_declared_and_inert_environment_variables(
    sandbox: LocalSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOOM_SECRET_KEY", "should-not-leak")
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import json, os
        print(json.dumps(dict(os.environ)))
        print(json.dumps(open("/proc/1/environ").read()))
        """,
        env={"API_TOKEN": "declared", "FLOOM_RUN_ID": "run-test", "FLOOM_OUTPUT_DIR": "/elsewhere"},
    )

    assert result.exit_code == 0, lines
    environ_line, init_environ_line = stream(lines, "stdout")
    environ = json.loads(environ_line)
    assert environ == {
        "API_TOKEN": "declared",
        "FLOOM_RUN_ID": "run-test",
        "FLOOM_OUTPUT_DIR": SANDBOX_OUTPUT_DIR,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PWD": "/work",  # set by bwrap after it changes directory
    }
    assert "should-not-leak" not in init_environ_line
    assert "FLOOM_SECRET_KEY" not in init_environ_line


def test_host_home_data_files_and_project_files_are_not_visible(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    data_file = tmp_path / "floom-data" / "floom.db"
    data_file.parent.mkdir()
    data_file.write_text("runs and secrets")
    hidden = ["/root", str(Path.home()), "/var", "/home", "/sys", "/run", str(data_file)]
    hidden.append(str(Path(__file__).resolve()))  # the host's checkout of this project
    result, lines = run_script(
        sandbox,
        tmp_path,
        f"""
        import os
        for path in {hidden!r}:
            print(path, "visible" if os.path.exists(path) else "hidden")
        """,
    )

    assert result.exit_code == 0, lines
    assert stream(lines, "stdout") == [f"{path} hidden" for path in hidden]


def test_system_directories_are_read_only(sandbox: LocalSandbox, tmp_path: Path) -> None:
    targets = ["/usr/floom-probe", "/usr/bin/python3", "/etc/passwd", "/floom-probe", "/dev/x"]
    result, lines = run_script(
        sandbox,
        tmp_path,
        f"""
        for path in {targets!r}:
            try:
                open(path, "a").close()
            except OSError as exc:
                print(path, "refused", exc.strerror)
            else:
                print(path, "WRITTEN")
        """,
    )

    assert result.exit_code == 0, lines
    outcomes = stream(lines, "stdout")
    assert [line.split()[:2] for line in outcomes] == [[path, "refused"] for path in targets]


def test_the_process_holds_no_capabilities_and_cannot_nest_namespaces(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import ctypes
        caps = dict(line.split(":\t") for line in open("/proc/self/status").read().splitlines())
        print(caps["CapEff"].strip(), caps["CapPrm"].strip())
        CLONE_NEWUSER = 0x10000000
        if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
            print("unshare refused")
        """,
    )

    assert result.exit_code == 0, lines
    assert stream(lines, "stdout") == ["0000000000000000 0000000000000000", "unshare refused"]


def test_files_written_to_the_output_dir_appear_on_the_host(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import os, pathlib
        out = pathlib.Path(os.environ["FLOOM_OUTPUT_DIR"])
        (out / "charts").mkdir()
        (out / "charts" / "q3.csv").write_text("a,b\\n1,2\\n")
        pathlib.Path("result.json").write_text('{"outputs": {"ok": true}}')
        """,
    )

    assert result.exit_code == 0, lines
    assert (tmp_path / "output" / "charts" / "q3.csv").read_text() == "a,b\n1,2\n"
    assert (tmp_path / "work" / "result.json").read_text() == '{"outputs": {"ok": true}}'


def test_network_is_off_by_default(
    sandbox: LocalSandbox, tmp_path: Path, listening_port: int
) -> None:
    result, lines = run_script(sandbox, tmp_path, connect_script(listening_port))

    assert result.exit_code == 3, lines


def connect_script(port: int) -> str:
    return f"""
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
        except OSError as exc:
            sys.exit(3)
        print("connected")
        """


def test_timeout_kills_the_whole_process_tree(sandbox: LocalSandbox, tmp_path: Path) -> None:
    marker = f"floom-test-{uuid.uuid4().hex}"
    ready = threading.Event()
    alive_when_ready: list[bool] = []

    def watch(stream: str, line: str) -> None:
        if line == "ready":
            alive_when_ready.append(bool(processes_with(marker)))
            ready.set()

    result, lines = run_script(
        sandbox,
        tmp_path,
        GRANDCHILD_WORKER,
        on_line=watch,
        env={"MARKER": marker},
        timeout_seconds=2.0,
    )

    assert ready.is_set(), lines
    assert alive_when_ready == [True]
    assert result.timed_out
    assert result.exit_code is None
    assert not result.cancelled
    assert processes_with(marker) == []


def test_cancel_kills_the_whole_process_tree(sandbox: LocalSandbox, tmp_path: Path) -> None:
    marker = f"floom-test-{uuid.uuid4().hex}"
    ready = threading.Event()
    alive_when_ready: list[bool] = []

    def watch(stream: str, line: str) -> None:
        if line == "ready":
            alive_when_ready.append(bool(processes_with(marker)))
            ready.set()

    started = time.monotonic()
    result, lines = run_script(
        sandbox,
        tmp_path,
        GRANDCHILD_WORKER,
        on_line=watch,
        should_cancel=ready.is_set,
        env={"MARKER": marker},
        timeout_seconds=60.0,
    )

    assert ready.is_set(), lines
    assert alive_when_ready == [True]
    assert result.cancelled
    assert result.exit_code is None
    assert not result.timed_out
    assert time.monotonic() - started < 30
    assert processes_with(marker) == []


def test_an_error_in_on_line_kills_the_process_tree_and_propagates(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    marker = f"floom-test-{uuid.uuid4().hex}"

    def explode(stream: str, line: str) -> None:
        if line == "ready":
            raise RuntimeError("the log store is down")

    with pytest.raises(RuntimeError, match="log store"):
        run_script(sandbox, tmp_path, GRANDCHILD_WORKER, on_line=explode, env={"MARKER": marker})

    assert processes_with(marker) == []


def test_allocating_more_than_the_memory_limit_fails(sandbox: LocalSandbox, tmp_path: Path) -> None:
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        try:
            block = bytearray(1024 * 1024 * 1024)
        except MemoryError:
            raise SystemExit(3)
        print("allocated a GiB")
        """,
        memory_mb=128,
    )

    # The run's cgroup ends it; a node without one refuses the allocation per process.
    assert result.limit_exceeded == "memory" or result.exit_code == 3, lines
    assert ("stdout", "allocated a GiB") not in lines


def test_a_tmpfs_cannot_grow_past_the_memory_limit(sandbox: LocalSandbox, tmp_path: Path) -> None:
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import errno
        chunk = b"x" * (1024 * 1024)
        try:
            with open("/tmp/fill", "wb") as fill:
                for _ in range(256):
                    fill.write(chunk)
                    fill.flush()
        except OSError as exc:
            raise SystemExit(3 if exc.errno == errno.ENOSPC else 4)
        """,
        memory_mb=64,
    )

    # Whichever is hit first: the tmpfs's size or the run's memory limit.
    assert result.exit_code == 3 or result.limit_exceeded == "memory", lines


@pytest.mark.skipif(shutil.which("node", path="/usr/local/bin:/usr/bin") is None, reason="no node")
def test_node_starts_under_the_default_memory_limit(sandbox: LocalSandbox, tmp_path: Path) -> None:
    result, lines = run_script(
        sandbox, tmp_path, "", command=["node", "-e", "console.log('node ok')"]
    )

    assert result.exit_code == 0, lines
    assert stream(lines, "stdout") == ["node ok"]


def test_a_command_missing_inside_the_sandbox_exits_nonzero_with_a_stderr_line(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    result, lines = run_script(sandbox, tmp_path, "", command=["no-such-program-here"])

    assert result.exit_code not in (0, None)
    [message] = stream(lines, "stderr")
    assert "no-such-program-here" in message
    assert result.error == message


def test_a_spec_without_a_command_is_refused(sandbox: LocalSandbox, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as caught:
        sandbox.run(
            SandboxSpec(run_id="r", command=[], workdir=tmp_path, output_dir=tmp_path),
            on_line=lambda stream, line: None,
            should_cancel=lambda: False,
        )

    assert caught.value.code == "invalid_request"
    assert caught.value.hint


def test_check_explains_how_to_install_bubblewrap_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        "floom.sandbox.local.backend.shutil.which",
        lambda name, *args, **kwargs: None if name == "bwrap" else real_which(name),
    )

    with pytest.raises(SandboxUnavailable) as caught:
        LocalSandbox().check()

    assert caught.value.code == "sandbox_unavailable"
    assert caught.value.status == 503
    assert caught.value.hint == "install bubblewrap: apt-get install bubblewrap"


def test_check_passes_on_this_machine(sandbox: LocalSandbox) -> None:
    sandbox.check()


def test_get_sandbox_builds_local_and_refuses_unknown_names() -> None:
    assert isinstance(get_sandbox("local"), LocalSandbox)

    with pytest.raises(InvalidRequest) as caught:
        get_sandbox("docker")

    assert caught.value.code == "invalid_request"
    assert caught.value.hint is not None
    assert "local" in caught.value.hint


def test_background_processes_end_with_the_worker(sandbox: LocalSandbox, tmp_path: Path) -> None:
    marker = f"floom-test-{uuid.uuid4().hex}"
    worker = GRANDCHILD_WORKER.replace("time.sleep(1000)\n", "\n")  # exit once it is ready

    result, lines = run_script(sandbox, tmp_path, worker, env={"MARKER": marker})

    assert result.exit_code == 0, lines
    assert stream(lines, "stdout") == ["ready"]
    assert processes_with(marker) == []


def _bwrap_sleeping_on(folder: Path) -> subprocess.Popen[bytes]:
    # Marked as floom marks the sandboxes it starts: a word of the command line that names
    # no host path (the environment is empty, the binds are the stage's when root).
    folder.mkdir(parents=True)
    marker = owner_marker(folder)
    proc = subprocess.Popen(
        ["bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
         "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
         "--unshare-all", "--", "/bin/sh", "-c", "exec sleep 60", "floom-run", marker],
        env={},
        start_new_session=True,
    )  # fmt: skip
    # Popen returns once the exec has begun; /proc shows the new command line a moment
    # later (under load, an immediate read found it empty half the time), and a scan
    # before then finds no sandbox to kill.
    wait_until(lambda: _shows(proc, os.fsencode(marker)))
    return proc


def _shows(proc: subprocess.Popen[bytes], marker: bytes) -> bool:
    assert proc.poll() is None, "bwrap exited before the test could use it"
    with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
        return marker in f.read().split(b"\0")


def test_kill_orphans_kills_only_sandboxes_on_this_nodes_work_root(tmp_path: Path) -> None:
    ours = _bwrap_sleeping_on(tmp_path / "data" / "runs" / "run_x-1" / "work")
    other = _bwrap_sleeping_on(tmp_path / "elsewhere" / "work")
    try:
        assert LocalSandbox().kill_orphans(tmp_path / "data" / "runs") >= 1
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for proc in (ours, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
