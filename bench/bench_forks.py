"""What a warm run's process start costs the machine: two forks a run (a reporter that unshares
a PID namespace and forks pid 1) against one (pid 1 forked into a PID namespace directly).

Run as root, on a quiet machine (it reads the whole machine's busy time from /proc/stat):

    python3 bench/bench_forks.py [--runs 400]

The process imports a few standard modules and freezes its heap, as a warm process does;
each child reads some JSON and walks the loaded modules before it exits.
"""

from __future__ import annotations

import argparse
import asyncio  # noqa: F401  (heap, as a warm process's)
import ctypes
import decimal  # noqa: F401
import email.message  # noqa: F401
import gc
import http.client  # noqa: F401
import json
import os
import ssl  # noqa: F401
import sys
import time
from collections.abc import Callable

_CLONE_NEWPID = 0x20000000
_libc = ctypes.CDLL(None, use_errno=True)


def busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def work() -> None:
    json.loads(json.dumps({"a": list(range(50))}))
    for module in list(sys.modules.values())[:200]:
        getattr(module, "__name__", None)


def two_forks() -> None:
    reporter = os.fork()
    if reporter == 0:
        _libc.unshare(_CLONE_NEWPID)
        init = os.fork()
        if init == 0:
            work()
            os._exit(0)
        os.waitpid(init, 0)
        os._exit(0)
    os.waitpid(reporter, 0)


def one_fork(own_pid_ns: int) -> None:
    _libc.unshare(_CLONE_NEWPID)
    init = os.fork()
    if init == 0:
        work()
        os._exit(0)
    _libc.setns(own_pid_ns, _CLONE_NEWPID)
    os.waitpid(init, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    gc.collect()
    gc.freeze()
    own = os.open("/proc/self/ns/pid", os.O_RDONLY)
    ways: dict[str, Callable[[], None]] = {
        "two forks": two_forks,
        "one fork": lambda: one_fork(own),
    }
    for _ in range(2):
        for name, way in ways.items():
            busy, started = busy_seconds(), time.perf_counter()
            for _ in range(args.runs):
                way()
            machine = (busy_seconds() - busy) * 1000 / args.runs
            wall = (time.perf_counter() - started) * 1000 / args.runs
            print(f"{name:9s}  {machine:.2f} ms machine a run, {wall:.2f} ms wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
