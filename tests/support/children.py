"""The processes a test process started and never waited for, read from /proc: the session's
guard (tests/conftest.py) fails when any outlives the tests, since on a CI machine each is a
leaked process (and Python warns `subprocess N is still running` at exit)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest


def children(pid: int | None = None) -> dict[int, str]:
    """The child processes of `pid` (this process by default): pid -> `<state> <command>`,
    `Z` for one that exited but was never waited for."""
    parent = os.getpid() if pid is None else pid
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        # `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        state, ppid = stat[stat.rindex(")") + 2 :].split(" ", 2)[:2]
        if int(ppid) == parent:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found[int(entry.name)] = f"{state} {command or stat.split(' ', 2)[1]}"[:200]
    return found


def children_left(*, grace: float = 5.0) -> dict[int, str]:
    """This process's children still there after up to `grace` seconds (one just stopped
    may take a moment to be gone)."""
    deadline = time.monotonic() + grace
    while True:
        # A Popen collected while its process ran is reaped by Python itself at the next
        # process start (subprocess's own clean-up); at the session's end none comes.
        reap_collected = getattr(subprocess, "_cleanup", None)
        if reap_collected is not None:
            reap_collected()
        left = children()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def fail_if_children_left(*, grace: float = 5.0) -> None:
    """pytest.fail, naming them, when this process still has children after `grace`."""
    left = children_left(grace=grace)
    if left:
        listed = "\n".join(f"  {pid}: {what}" for pid, what in sorted(left.items()))
        pytest.fail(
            f"processes started by the tests were not stopped and waited for:\n{listed}",
            pytrace=False,
        )
