"""The end of a sandbox's command read from the host's /proc while its pid 1 is held stopped
(floom/sandbox/local/procfs.py): the command is found even when it is not pid 2 inside (a
helper ran and was reaped before it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from floom.sandbox.local import procfs
from tests.support.stops import stop

# pid 1 of a new PID namespace: runs `true` (pid 2, reaped), then forks the "command"
# (pid 3), which exits 7 after a moment; the test stops pid 1 from the host before then.
INIT = """
import os, subprocess, time
subprocess.run(["true"])
if os.fork() == 0:
    time.sleep(0.5)
    os._exit(7)
time.sleep(60)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root here")


def _child_of(pid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2 :].split()[1] == str(pid):
                return int(entry)
    return None


def _command_forked(init: int) -> bool:
    child = _child_of(init)
    if child is None:
        return False
    try:
        return Path(f"/proc/{child}/cmdline").read_bytes().startswith(sys.executable.encode())
    except OSError:
        return False


def test_the_command_is_found_under_a_stopped_pid_1_when_it_is_not_pid_2() -> None:
    outer = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", INIT])
    try:
        deadline = time.monotonic() + 10
        init = None
        while init is None or not _command_forked(init):  # pid 1 and its command are there
            assert time.monotonic() < deadline, "the namespace did not start"
            init = _child_of(outer.pid)
            time.sleep(0.01)
        stop(init)
        code = None
        while code is None:
            assert time.monotonic() < deadline, "no exit code read"
            code = procfs.command_exit_under_stopped_init(init)
            time.sleep(0.05)
        assert code == 7
    finally:
        init = _child_of(outer.pid)
        if init is not None:
            os.kill(init, signal.SIGKILL)
        outer.kill()
        outer.wait(timeout=10)
