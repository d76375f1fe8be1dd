"""The host's processes as /proc/<pid>/status tells them, for tests that look for what a
sandbox left behind."""

from __future__ import annotations

import os
from collections.abc import Iterator


def process_statuses() -> Iterator[dict[str, str]]:
    """Each process's /proc/<pid>/status fields (`Pid`, `PPid`, `Uid`, ...); a process
    gone while it is read is passed over."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                yield dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
