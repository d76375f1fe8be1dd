"""floom's side of the lease watchdog (floom/sandbox/watchdog.py): a sandbox never outlives
its attempt's lease, even when floom's own process is frozen or cut off from the database.

Each attempt has a key, `<run id>.<lease epoch>`, and a deadline on this host's
CLOCK_BOOTTIME (`lease_clock`): the lease's expiry less a margin. Not CLOCK_MONOTONIC: it
stops while the host is suspended, while the lease (wall clock) runs on, so after a resume
a sandbox would outlive its lease until the next heartbeat found it lost. The executor sets
it when it claims the run and moves it on only after a renewal of the lease committed; a
backend names the processes of the attempt's sandboxes (their cgroup, or the launcher's
process group) while they run. The watchdog, a process of its own, kills them once the
deadline passes, whatever floom's process is doing then. Here the same deadline says that an
attempt has lapsed: its sandbox is being ended and it records nothing (the reaper of some
node requeues the run).

Writing to the watchdog never blocks: each change is one line on a non-blocking pipe. A
watchdog that died is started again with the whole state; a full pipe refuses a new sandbox
(SandboxUnavailable) rather than run it unwatched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from floom.sandbox.base import SandboxUnavailable

log = logging.getLogger("floom.sandbox")

WATCHDOG_PROGRAM: Final = Path(__file__).with_name("watchdog.py")
# A deadline is the lease's expiry less this share of the lease (at most MAX_MARGIN_SECONDS):
# the time the watchdog has to kill the sandbox before any other node may take the lease.
MARGIN_SHARE: Final = 0.1
MAX_MARGIN_SECONDS: Final = 1.0
_PIPE_BUF: Final = 4096  # writes up to this size are atomic on a pipe
# The pipe holds this much (F_SETPIPE_SZ; the kernel's default is 64 KiB): some ten thousand
# lines, so a burst of runs never waits for the watchdog to read.
PIPE_BYTES: Final = 1 << 20
# A new sandbox waits at most this long for room in a full pipe before it is refused.
WATCH_WAIT_SECONDS: Final = 1.0


LEASE_CLOCK: Final = time.CLOCK_BOOTTIME


def lease_clock() -> float:
    """Now on the clock of every fence deadline (CLOCK_BOOTTIME seconds): the time since
    boot, suspends included."""
    return time.clock_gettime(LEASE_CLOCK)


def margin_seconds(lease_seconds: float) -> float:
    return min(MAX_MARGIN_SECONDS, lease_seconds * MARGIN_SHARE)


def fence_key(run_id: str, epoch: int) -> str:
    return f"{run_id}.{epoch}"


class LeaseFence:
    """The deadlines of this process's attempts and the sandboxes they end, mirrored to one
    watchdog process (started at first use)."""

    def __init__(self, *, program: Path = WATCHDOG_PROGRAM) -> None:
        self._program = program
        self._lock = threading.Lock()
        self._deadlines: dict[str, float] = {}
        self._targets: dict[str, set[str]] = {}
        self._lapsed: set[str] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1

    # the executor's side

    def arm(self, key: str, deadline: float) -> bool:
        """Set or move on `key`'s deadline (lease_clock seconds). False, changing nothing,
        when the attempt has lapsed already (its deadline passed: its sandbox is being
        ended) or the watchdog could not be told (the earlier deadline stands)."""
        with self._lock:
            if self._lapsed_locked(key):
                return False
            current = self._deadlines.get(key)
            if current is not None and deadline <= current:
                return True
            if not self._send([f"deadline {key} {deadline:.6f}"]):
                return False
            self._deadlines[key] = deadline
            return True

    def lapsed(self, key: str) -> bool:
        """Whether `key`'s deadline has passed (for good: a later renewal changes nothing)."""
        with self._lock:
            return self._lapsed_locked(key)

    def deadline(self, key: str) -> float | None:
        with self._lock:
            return self._deadlines.get(key)

    def forget(self, key: str) -> None:
        """The attempt ended: its key is dropped here and in the watchdog."""
        with self._lock:
            self._deadlines.pop(key, None)
            self._targets.pop(key, None)
            self._lapsed.discard(key)
            self._send([f"forget {key}"])

    # the sandbox backend's side

    def watch(self, key: str, targets: Iterable[str]) -> None:
        """The processes of one of the attempt's sandboxes (`cgroup:<dir>` for each of its
        cgroup's directories, or `group:<pgid>`): the watchdog kills them at the deadline,
        at once when it passed already. Raises SandboxUnavailable when the watchdog cannot
        be told (the sandbox must then not start)."""
        lines = [f"watch {key} {target}" for target in targets]
        with self._lock:
            if not self._send(lines, wait=WATCH_WAIT_SECONDS):
                raise SandboxUnavailable(
                    "the lease watchdog is not answering, so the sandbox would not be ended "
                    "with its lease",
                    hint="the node may be overloaded; the run is retried",
                )
            self._targets.setdefault(key, set()).update(t.split(" ", 2)[2] for t in lines)

    def unwatch(self, key: str, targets: Iterable[str]) -> None:
        targets = list(targets)
        with self._lock:
            known = self._targets.get(key)
            if known is not None:
                known.difference_update(targets)
            self._send([f"unwatch {key} {target}" for target in targets])

    def close(self) -> None:
        """Stop the watchdog once this process's attempts have ended (tests; exit does it)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    @property
    def watchdog_pid(self) -> int | None:
        with self._lock:
            return None if self._proc is None else self._proc.pid

    # under the lock

    def _lapsed_locked(self, key: str) -> bool:
        if key in self._lapsed:
            return True
        deadline = self._deadlines.get(key)
        if deadline is not None and deadline <= lease_clock():
            self._lapsed.add(key)
            return True
        return False

    def _send(self, lines: list[str], *, wait: float = 0.0) -> bool:
        """Write `lines` without blocking (with `wait`, for room in a full pipe up to that
        many seconds); False when the pipe stayed full or no watchdog runs."""
        if not lines:
            return True
        gone = self._fd < 0 or (self._proc is not None and self._proc.poll() is not None)
        if gone and not self._start():
            return False
        try:
            self._write(lines)
        except BlockingIOError:
            if wait and select.select([], [self._fd], [], wait)[1]:
                return self._send(lines)
            log.warning("the lease watchdog's pipe is full; a change was not sent")
            return False
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            # It died: a new one gets the whole state, which already holds nothing of `lines`.
            if not self._start():
                return False
            try:
                self._write(lines)
            except OSError:
                return False
        return True

    def _write(self, lines: list[str]) -> None:
        chunk = b""
        for line in lines:
            data = line.encode("ascii") + b"\n"
            if chunk and len(chunk) + len(data) > _PIPE_BUF:
                os.write(self._fd, chunk)
                chunk = b""
            chunk += data
        if chunk:
            os.write(self._fd, chunk)

    def _start(self) -> bool:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        read_fd, write_fd = os.pipe()
        try:
            self._proc = subprocess.Popen(
                # Isolated: no site, no PYTHON* variable, no user site; floom's code only.
                [sys.executable, "-I", "-S", os.fspath(self._program)],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                env={},
                cwd="/",
                # Its own session: what stops floom's process group does not stop it.
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            log.error("cannot start the lease watchdog: %s", exc)
            return False
        os.close(read_fd)
        with contextlib.suppress(OSError):  # a smaller pipe only fills sooner
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(write_fd, False)
        self._fd = write_fd
        state = [f"deadline {key} {when:.6f}" for key, when in self._deadlines.items()]
        state += [
            f"watch {key} {target}" for key, targets in self._targets.items() for target in targets
        ]
        try:
            self._write(state)
        except OSError:
            return False
        return True


_NODE_FENCE = LeaseFence()


def node_fence() -> LeaseFence:
    """This process's fence: one watchdog for every executor and sandbox in it."""
    return _NODE_FENCE
