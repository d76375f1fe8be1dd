"""The local sandbox's launch path: what the processes that start a sandbox (the launcher,
setpriv, bubblewrap, the sandbox's pid 1) see of the run. None of them reads a byte of the
run's environment or command: those reach the sandbox's first process only, after the drop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox
from floom.sandbox.local.backend import owner_marker
from tests.support.rigs.sandboxes import run_script

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)

# A shared object that, loaded into any process, appends that process's uid to MARKER.
MARKING_LIBRARY = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char line[64];
    int n = snprintf(line, sizeof line, "loaded as uid %d\n", (int)geteuid());
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) {
        write(fd, line, n);
        close(fd);
    }
}
"""


@pytest.fixture(params=["own uid", "floom's uid"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[LocalSandbox]:
    # uids=None: no uid of its own (floom's; bubblewrap's user namespace maps it), as a
    # floom that is not root starts its sandboxes.
    local = LocalSandbox(uids=None) if request.param == "floom's uid" else LocalSandbox()
    yield local
    local.close()  # its launchers started ahead of a next run


@dataclass(frozen=True)
class Process:
    pid: int
    argv: list[bytes]
    uids: list[int]


def _processes_holding(needle: bytes) -> tuple[list[Process], list[Process]]:
    """The host's processes with `needle` in their command line, and in their environment."""
    in_argv: list[Process] = []
    in_environ: list[Process] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue  # it ended meanwhile
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        process = Process(int(entry), argv, [int(u) for u in uid_line.split()[1:]])
        if any(needle in arg for arg in argv):
            in_argv.append(process)
        if needle in environ:
            in_environ.append(process)
    return in_argv, in_environ


def test_a_loader_variable_among_a_runs_secrets_loads_nothing_into_a_host_process(
    sandbox: LocalSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack of issue 28: a secret named LD_PRELOAD pointing at a library the worker
    ships. The rule that refuses such names is bypassed here (as for a secret stored before
    it), to test the launch path itself."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    marker = tmp_path / "loaded-on-the-host"
    source = tmp_path / "mark.c"
    source.write_text(MARKING_LIBRARY)
    workdir = tmp_path / "work"
    workdir.mkdir()
    library = workdir / "mark.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)],
        check=True,
    )
    monkeypatch.setattr("floom.sandbox.local.backend.validate_spec", lambda spec: None)
    loader_variables = {"LD_PRELOAD": str(library), "LD_AUDIT": str(library)}

    result, lines = run_script(sandbox, tmp_path, "print('ran')", env=loader_variables)

    assert ("stdout", "ran") in lines, lines
    assert result.exit_code == 0, lines
    assert not marker.exists(), marker.read_text()


def test_while_a_run_runs_its_secret_and_command_are_held_by_its_own_process_alone(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    secret = f"secret-{uuid.uuid4().hex}".encode()
    argument = f"argument-{uuid.uuid4().hex}".encode()
    seen: dict[str, tuple[list[Process], list[Process]]] = {}
    emptied: list[int] = []

    def look_while_running(stream: str, line: str) -> None:
        if line != "ready":
            return
        seen["secret"] = _processes_holding(secret)
        seen["argument"] = _processes_holding(argument)
        marker = os.fsencode(owner_marker(tmp_path / "work"))
        bwraps, _ = _processes_holding(marker)
        # Their stdin was the memory file the run's environment came in: emptied by now.
        emptied.extend(os.stat(f"/proc/{p.pid}/fd/0").st_size for p in bwraps)
        (tmp_path / "work" / "go").touch()

    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import os, time
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)
        """,
        command=["python3", "run.py", argument.decode()],
        env={"API_TOKEN": secret.decode()},
        on_line=look_while_running,
    )

    assert result.exit_code == 0, lines
    secret_argv, secret_environ = seen["secret"]
    assert secret_argv == []
    # The worker's own process; no bwrap, setpriv or launcher, no root process.
    assert [p.argv[1:3] for p in secret_environ] == [[b"run.py", argument]]
    if sandbox.protections()["unprivileged_uid"]:
        assert all(uid != 0 for p in secret_environ for uid in p.uids)
    argument_argv, _ = seen["argument"]
    assert [p.argv[1:3] for p in argument_argv] == [[b"run.py", argument]]
    assert emptied
    assert set(emptied) == {0}


def test_the_sandboxs_pid_1_starts_with_an_empty_environment_and_no_host_path(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    result, lines = run_script(
        sandbox,
        tmp_path,
        """
        import json
        def read(path):
            try:
                return open(path, "rb").read().decode()
            except OSError as exc:
                return "unreadable " + type(exc).__name__
        print(json.dumps({
            "init": read("/proc/1/environ"),
            "self": read("/proc/self/environ"),
            "init_argv": read("/proc/1/cmdline"),
        }))
        """,
        env={"API_TOKEN": secret},
    )

    assert result.exit_code == 0, lines
    [(_stream, line)] = lines
    seen = json.loads(line)
    assert seen["init"] == ""
    host_paths = {str(tmp_path), os.path.realpath(tmp_path)}
    for text in (seen["init"], seen["self"]):
        assert not any(path in text for path in host_paths)
    assert secret in seen["self"]
    assert "FLOOM_SANDBOX_FOR" not in seen["self"]
    assert secret not in seen["init_argv"]
