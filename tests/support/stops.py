"""Stopping a process from a test (SIGSTOP) and knowing that it has stopped.

`os.kill` returns once the signal is queued; the process stops only when it next runs, and
on a loaded machine that may be a while. Until then it goes on: a parent waiting for its
children still reaps one that ends meanwhile (the kernel's wait looks for an ended child
before it lets the signal in), a node still claims a run. A test that means "while it is
stopped" waits for the stop."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.harness import wait_until


def stop(pid: int, *, group: bool = False, timeout: float = 10) -> None:
    """SIGSTOP process `pid` (`group`: its process group, which it leads) and return once
    every thread of `pid` has stopped; AssertionError if that takes over `timeout` s."""
    if group:
        os.killpg(pid, signal.SIGSTOP)
    else:
        os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: stopped(pid), timeout=timeout, interval=0.005)


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is in a stop (state T); raises
    ProcessLookupError once it is gone."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        states.append(stat[stat.rindex(")") + 2 :].split(" ", 1)[0])
    return bool(states) and all(state == "T" for state in states)
