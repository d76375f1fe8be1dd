"""The host uids a root floom's sandboxes run as: one per running sandbox, from a range
floom owns.

Runs that share a host uid share the kernel's per-uid counters (inotify instances and
watches, user namespaces, processes, locked memory, ...) and may signal or read each other's
processes from the host. So each sandbox takes a uid of its own from the range
`[base, base + count)` (settings FLOOM_SANDBOX_UID_BASE, FLOOM_SANDBOX_UID_COUNT) when it
starts, and gives it back when its process tree has ended; its gid is the same number.

A uid is held by an exclusive record lock on the file named after it under LOCK_DIR (root's
own, 0700), and within floom's process by a set: the kernel drops the lock when the holder
exits, so a uid is never lost to a crashed floom, and two floom processes on one machine (or
two sandboxes of one process) never take the same uid while both run. Uniqueness is per
machine, which is all the kernel's counters are. A floom that crashed may leave sandboxes
running as a uid it held; the next start kills them (LocalSandbox.kill_orphans) before it
runs anything.

The default range starts at 0x70000000 (1879048192), above every range distributions
assign: regular users (1000-60000), systemd's dynamic users (61184-65519), nobody (65534),
`useradd`'s subordinate ranges (from 100000, up to 600100000) and systemd's container ranges
(524288-1879048191); the block up to 2^31 is left unused by systemd's conventions. A range
that holds a user or group of /etc/passwd or /etc/group, or floom's own uid, is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from floom.sandbox.base import SandboxUnavailable

DEFAULT_UID_BASE: Final = 0x70000000
DEFAULT_UID_COUNT: Final = 1024
MAX_UID: Final = 2**31 - 1
"""Uids from 2^31 up are read as negative numbers by some programs: never handed out."""
LOCK_DIR: Final = Path("/run/floom-uids")


class UidsUnavailable(SandboxUnavailable):
    """No sandbox uid can be taken: the range is misconfigured, or every uid is in use."""


@dataclass(frozen=True)
class UidRange:
    """The uids `base` to `base + count - 1` (and the gids of the same numbers)."""

    base: int = DEFAULT_UID_BASE
    count: int = DEFAULT_UID_COUNT

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    def __str__(self) -> str:
        return f"{self.base}-{self.last}"

    def problem(self) -> str | None:
        """Why this range may not be floom's, or None: out of bounds, or it holds a user or
        group of this machine's, or floom's own uid."""
        if self.base < 1 or self.count < 1 or self.last > MAX_UID:
            return f"the sandbox uid range {self} must lie within 1-{MAX_UID}"
        own = {os.getuid(), os.geteuid(), os.getgid(), os.getegid()}
        for uid in sorted(own):
            if self.base <= uid <= self.last:
                return f"the sandbox uid range {self} holds floom's own uid or gid {uid}"
        for user in pwd.getpwall():
            for number, what in ((user.pw_uid, "uid"), (user.pw_gid, "gid")):
                if self.base <= number <= self.last:
                    return f"the sandbox uid range {self} holds the {what} of user {user.pw_name}"
        for group in grp.getgrall():
            if self.base <= group.gr_gid <= self.last:
                return f"the sandbox uid range {self} holds the gid of group {group.gr_name}"
        return None


@dataclass(eq=False)
class UidLease:
    """One uid taken from a pool until `release` (idempotent)."""

    uid: int
    _fd: int

    def release(self) -> None:
        with _HOLDING:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                _HELD.discard(self.uid)
                os.close(fd)  # closing the file drops its lock


class UidPool:
    """Hands out the uids of `uids`, each to one holder at a time on this machine."""

    def __init__(self, uids: UidRange, lock_dir: Path = LOCK_DIR) -> None:
        self.uids = uids
        self._lock_dir = lock_dir
        self._next = 0
        self._checked = False

    def check(self) -> None:
        """Raise UidsUnavailable when the range may not be used (see UidRange.problem) or
        its lock dir is not root's own; checked once per pool."""
        if self._checked:
            return
        problem = self.uids.problem()
        if problem is not None:
            raise UidsUnavailable(
                problem,
                hint="choose a free block with FLOOM_SANDBOX_UID_BASE and "
                "FLOOM_SANDBOX_UID_COUNT (docs/reference/resource-limits.md, Sandbox uids)",
                retryable=False,
            )
        _make_lock_dir(self._lock_dir)
        self._checked = True

    def take(self) -> UidLease:
        """A uid no other sandbox on this machine holds; raises UidsUnavailable when every
        uid of the range is held. Tries the uids in turn from after the last one taken, so
        a uid given back is the last to be taken again."""
        self.check()
        count = self.uids.count
        with _HOLDING:
            for step in range(count):
                offset = (self._next + step) % count
                uid = self.uids.base + offset
                fd = self._lock(uid) if uid not in _HELD else None
                if fd is not None:
                    _HELD.add(uid)
                    self._next = (offset + 1) % count
                    return UidLease(uid, fd)
        raise UidsUnavailable(
            f"all {count} sandbox uids ({self.uids}) are in use",
            hint="raise FLOOM_SANDBOX_UID_COUNT, or run fewer sandboxes at once on this node",
            retryable=True,
        )

    def _lock(self, uid: int) -> int | None:
        """An open descriptor of `uid`'s file holding its lock, or None when another process
        holds it. A record lock (lockf), not flock: a child forked while it is held does not
        inherit it (a launcher forked at that moment would hold a flock until it execs).
        The caller holds _HOLDING and knows this process holds no lock on the file: closing
        any descriptor of a file drops the process's record locks on it."""
        fd = os.open(self._lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def free(self) -> int:
        """How many uids of the range no sandbox of this process holds: cheap (no file is
        opened), so those another process holds count as free here."""
        base, last = self.uids.base, self.uids.last
        with _HOLDING:
            return self.uids.count - sum(1 for uid in _HELD if base <= uid <= last)

    def held(self) -> set[int]:
        """The uids of the range some process holds now (for tests and doctor)."""
        found = set()
        with _HOLDING:
            for uid in range(self.uids.base, self.uids.last + 1):
                if uid in _HELD:
                    found.add(uid)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(self._lock_dir / str(uid), os.O_RDWR | os.O_CLOEXEC)
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        found.add(uid)
                    finally:
                        os.close(fd)
        return found


_HOLDING = threading.Lock()
_HELD: set[int] = set()
"""The uids this process holds: record locks are the process's, so two of its sandboxes
would not see each other's."""


def _make_lock_dir(path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise UidsUnavailable(
            f"{path} is not a directory of floom's own; remove it and start the server again",
            retryable=False,
        )
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(path, 0o700)
