"""The lease watchdog: a small process of its own that ends a run's sandbox when the run's
lease was not renewed in time, even while floom's own process is frozen or cut off.

It is floom's code only, run as `python3 -I -S <this file>` (no site, no environment, no
import of floom or of anything outside the standard library) in a session of its own, so a
SIGSTOP of floom's process or process group does not stop it. Its one input is a pipe from
floom (floom/sandbox/fence.py), one line per change, none carrying a worker's bytes:

    deadline <key> <boottime seconds>    the attempt's sandboxes end at this CLOCK_BOOTTIME
    watch <key> cgroup:<dir>             a directory of one of its sandboxes' cgroups
    watch <key> group:<pgid>             its launcher's process group (no cgroup on the node)
    unwatch <key> <target>               that sandbox ended on its own
    forget <key>                         the attempt ended

A key is `<run id>.<lease epoch>`. Once a key's deadline passes, every process of its
targets is killed and the key stays fired: a later `watch` of it is killed at once and a
later `deadline` changes nothing. When the pipe closes (floom exited or died), the targets
still watched are killed at once (their node is gone; nobody would record their end) and the
watchdog exits.

Deadlines are on CLOCK_BOOTTIME, which counts the time the host was suspended, as the
database lease (wall clock) does; CLOCK_MONOTONIC stops then, and a sandbox would outlive
its lease after a resume. The wait for the next deadline is a CLOCK_BOOTTIME timerfd for
the same reason: a select timeout is counted on CLOCK_MONOTONIC.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import select
import signal
import sys
import time
from collections.abc import Iterable

# A floom run id (run_<hex>) and its lease epoch.
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}\.[0-9]{1,18}")
_KILL_SECONDS = 5.0
# floom/sandbox/fence.py's LEASE_CLOCK: the clock of every deadline on the pipe.
CLOCK = time.CLOCK_BOOTTIME
# Without a timerfd (no ctypes), the wait for a deadline wakes at least this often, so a
# resume is seen within it.
_FALLBACK_WAIT_SECONDS = 0.5
_TFD_TIMER_ABSTIME = 1


def now() -> float:
    return time.clock_gettime(CLOCK)


class _Attempt:
    __slots__ = ("deadline", "fired", "targets")

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.targets: set[str] = set()
        self.fired = False


def _valid_target(target: str) -> bool:
    kind, _, value = target.partition(":")
    if kind == "cgroup":
        # A run's cgroup directory as floom makes them: .../floom/run-<hex>.
        parent, name = os.path.split(value)
        return (
            os.path.isabs(value)
            and os.path.normpath(value) == value
            and os.path.basename(parent) == "floom"
            and name.startswith("run-")
        )
    if kind == "group":
        return value.isdigit() and int(value) > 1
    return False


def _read_pids(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs"), "rb") as file:
            return [int(p) for p in file.read().split()]
    except (OSError, ValueError):
        return []


def kill_targets(targets: Iterable[str]) -> None:
    """Kill every process of each of `targets` until none is left (bounded). A cgroup v2
    directory with cgroup.kill is killed by the kernel in one step; otherwise each pid it
    lists is sent SIGKILL, pass after pass (its process limit bounds what a fork can add).
    Every target gets its kill in each pass: one whose processes linger (stuck in the
    kernel) holds up the others by no more than a pass."""
    left = list(dict.fromkeys(targets))
    deadline = time.monotonic() + _KILL_SECONDS
    while left and time.monotonic() < deadline:
        left = [target for target in left if _kill_pass(target)]
        if left:
            time.sleep(0.005)


def _kill_pass(target: str) -> bool:
    """One kill of `target`'s processes; whether any was still there to kill."""
    kind, _, value = target.partition(":")
    if kind == "group":
        with contextlib.suppress(OSError):
            os.killpg(int(value), signal.SIGKILL)
        return False
    pids = _read_pids(value)
    if not pids:
        return False
    kill_file = os.path.join(value, "cgroup.kill")
    if os.path.exists(kill_file):
        try:
            with open(kill_file, "w") as file:
                file.write("1")
        except OSError:
            pass
    else:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return True


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"floom-watchdog: {message}\n".encode())


class Watchdog:
    def __init__(self) -> None:
        self.attempts: dict[str, _Attempt] = {}

    def handle(self, line: str) -> None:
        words = line.split(" ")
        if len(words) < 2 or not _KEY.fullmatch(words[1]):
            _say(f"ignored a malformed line ({len(line)} characters)")
            return
        verb, key = words[0], words[1]
        if verb == "forget" and len(words) == 2:
            self.attempts.pop(key, None)
            return
        attempt = self.attempts.setdefault(key, _Attempt())
        if verb == "deadline" and len(words) == 3:
            try:
                deadline = float(words[2])
            except ValueError:
                return
            if not attempt.fired:
                attempt.deadline = deadline
        elif verb == "watch" and len(words) == 3 and _valid_target(words[2]):
            attempt.targets.add(words[2])
            if attempt.fired:
                kill_targets([words[2]])
        elif verb == "unwatch" and len(words) == 3:
            attempt.targets.discard(words[2])
        else:
            _say(f"ignored a malformed line ({len(line)} characters)")

    def fire_due(self, now: float) -> None:
        ended = []
        for key, attempt in self.attempts.items():
            if attempt.fired or attempt.deadline is None or attempt.deadline > now:
                continue
            attempt.fired = True
            if attempt.targets:
                ended.append(key)
        # Every due attempt's sandboxes are killed together: one that lingers must not hold
        # up the end of another whose lease lapsed at the same moment.
        kill_targets(target for key in ended for target in self.attempts[key].targets)
        # Said once every due sandbox has ended: a write to a slow or full log (a pipe
        # nobody reads while floom is stopped) must not hold up a kill.
        for key in ended:
            _say(f"lease of {key} not renewed in time: its sandbox was ended")

    def next_deadline(self) -> float | None:
        due = [a.deadline for a in self.attempts.values() if not a.fired and a.deadline]
        return min(due) if due else None

    def kill_all(self) -> None:
        kill_targets(target for attempt in self.attempts.values() for target in attempt.targets)
        self.attempts.clear()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class DeadlineTimer:
    """A timerfd on CLOCK that becomes readable when the clock reaches the time it was set
    to (also when that passed during a suspend: the kernel wakes its waiters at resume).
    `fd` is -1 where no timerfd could be made; the caller then waits in short steps."""

    def __init__(self) -> None:
        self.fd = -1
        self._set: float | None = None
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.timerfd_create(CLOCK, os.O_CLOEXEC | os.O_NONBLOCK)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd

    def set(self, deadline: float | None) -> None:
        """Fire at `deadline` (CLOCK seconds); None disarms."""
        if self.fd < 0 or deadline == self._set:
            return
        # Rounded up: the timer must not fire before `deadline` reads as passed.
        nanoseconds = math.ceil(max(deadline or 0.0, 0.0) * 1e9)
        value = _Timespec(*divmod(nanoseconds, 1_000_000_000))
        if deadline is not None and value.tv_sec == value.tv_nsec == 0:
            value.tv_nsec = 1  # zero would disarm it
        spec = _Itimerspec(_Timespec(0, 0), value)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None):
            _say(f"cannot set the deadline timer (errno {ctypes.get_errno()})")
            os.close(self.fd)
            self.fd = -1
            return
        self._set = deadline

    def clear(self) -> None:
        """Read off an expiry (the fd stays readable until then); the next `set` arms it
        again whatever it is set to."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self.fd, 8)
        self._set = None


def serve(fd: int) -> None:
    """Read floom's lines from `fd` and end sandboxes at their deadlines, until the pipe
    closes (then every target still watched is killed)."""
    timer = DeadlineTimer()
    try:
        _serve(fd, Watchdog(), timer)
    finally:
        if timer.fd >= 0:
            os.close(timer.fd)


def _serve(fd: int, watchdog: Watchdog, timer: DeadlineTimer) -> None:
    pending = b""
    while True:
        watchdog.fire_due(now())
        due = watchdog.next_deadline()
        timer.set(due)
        if due is None or timer.fd >= 0:
            timeout = None
        else:
            timeout = min(max(0.0, due - now()), _FALLBACK_WAIT_SECONDS)
        waited = [fd] if timer.fd < 0 else [fd, timer.fd]
        ready, _, _ = select.select(waited, [], [], timeout)
        if timer.fd >= 0 and timer.fd in ready:
            timer.clear()
        if fd not in ready:
            continue
        try:
            data = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not data:
            watchdog.kill_all()
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        if len(pending) > 4096:
            pending = b""
        for raw in lines:
            watchdog.handle(raw.decode("ascii", "replace"))


def main() -> int:
    # Not stopped by what stops floom's process group; a terminal's signals are not ours.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    serve(sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
