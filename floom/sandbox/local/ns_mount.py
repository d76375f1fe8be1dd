"""A run's stage mounted from floom's own process, in its launcher's mount namespace.

A root floom puts each run's directories on its launcher's stage (floom/sandbox/local/identity.py):
the work dir laid over the version's cached files with an overlay, the output dir bound.
Exec'ing mount(8) costs about 1.1 ms a mount (0.8 ms of it loading the program and its
libraries). Instead, one thread of floom's, with filesystem attributes of its own (unshare
CLONE_FS, without which a threaded process may not change its mount namespace), enters the
launcher's mount namespace (setns), calls mount(2) for each, and goes back.

Whatever it cannot do is left to the launcher's script, as before: a mount is reported as not
made when the launcher is not in a namespace of its own yet (it would land on the host), when
the kernel refuses it, or when the thread is unusable. A thread that could not go back to
floom's namespace is never used again.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger("floom.sandbox")

CLONE_FS: Final = 0x00000200
CLONE_NEWNS: Final = 0x00020000
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_BIND: Final = 0x1000
WAIT_SECONDS: Final = 5.0
"""How long a caller waits for the thread to start on its mounts; after that they are
abandoned (never made later) and the launcher's script makes them."""


@dataclass(frozen=True)
class Mount:
    """One mount(2): an overlay (`fstype` "overlay", its options in `data`), a run's disk
    (`fstype` "ext4", its device the source), a devpts instance or a bind."""

    source: str
    target: str
    fstype: str | None = None
    flags: int = 0
    data: str | None = None

    @classmethod
    def bind(cls, source: str, target: str) -> Mount:
        return cls(source, target, flags=MS_BIND)

    @classmethod
    def overlay(cls, options: str, target: str) -> Mount:
        return cls("floom-work", target, "overlay", 0, options)

    @classmethod
    def disk(cls, device: str, target: str) -> Mount:
        """A run's disk (floom/sandbox/local/disks.py), by its loop device: the same filesystem as
        floom's own mount of it."""
        return cls(device, target, "ext4", MS_NOSUID | MS_NODEV)

    @classmethod
    def devpts(cls, options: str, target: str) -> Mount:
        """A devpts instance of its own (its `options` say how many ptys it may hold)."""
        return cls("devpts", target, "devpts", MS_NOSUID | MS_NOEXEC, options)

    def command(self, program: str) -> list[str]:
        """The same mount as a command line of mount(8) at `program`, for a shell to run."""
        if self.fstype is None:
            return [program, "--bind", self.source, self.target]
        options = [self.data] if self.data else []
        options += [name for flag, name in _FLAG_NAMES if self.flags & flag]
        return [program, "-t", self.fstype, self.source, "-o", ",".join(options), self.target]


_FLAG_NAMES: Final = ((MS_NOSUID, "nosuid"), (MS_NODEV, "nodev"), (MS_NOEXEC, "noexec"))


@dataclass
class PendingMounts:
    """Mounts handed to the thread; `wait` says which were made."""

    pid: int
    mounts: tuple[Mount, ...]
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    abandoned: bool = False
    made: tuple[bool, ...] = ()

    def wait(self) -> tuple[bool, ...]:
        """Whether each mount was made, in order: all False when the thread did not start on
        them in WAIT_SECONDS (it then never will: two overlays on one upper dir refuse each
        other)."""
        if not self.done.wait(WAIT_SECONDS):
            with self.lock:
                if not self.started:
                    self.abandoned = True
                    return self._made()
            self.done.wait()
        return self._made()

    def _made(self) -> tuple[bool, ...]:
        return self.made or (False,) * len(self.mounts)


class NamespaceMounter:
    """Mounts in other processes' mount namespaces from one thread of this process, started
    on first use."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[PendingMounts] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._broken = False

    def start(self, pid: int, mounts: tuple[Mount, ...]) -> PendingMounts:
        """Have the thread make `mounts`, in order, in the mount namespace of process `pid`,
        a child of floom's that has one of its own; the caller goes on and `wait`s for them
        later (a mount not made is the caller's to make another way)."""
        job = PendingMounts(pid, mounts)
        if self._broken:
            job.done.set()
            return job
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="floom-ns-mount", daemon=True
                )
                self._thread.start()
        self._jobs.put(job)
        return job

    def _serve(self) -> None:
        try:
            libc = _libc()
            if libc.unshare(CLONE_FS) != 0:
                raise _errno_error("unshare")
            home = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("mounting runs' stages from floom's process is unavailable: %s", exc)
            self._broken = True
            self._fail_all()
            return
        while not self._broken:
            job = self._jobs.get()
            try:
                with job.lock:
                    job.started = not job.abandoned
                if job.started:
                    job.made = self._mount(libc, home, job)
            finally:
                job.done.set()
        self._fail_all()

    def _mount(self, libc: ctypes.CDLL, home: int, job: PendingMounts) -> tuple[bool, ...]:
        """Which of the job's mounts were made; () for none (PendingMounts.wait)."""
        try:
            theirs = os.open(f"/proc/{job.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return ()  # it ended
        try:
            if os.fstat(theirs).st_ino == os.fstat(home).st_ino:
                return ()  # not in a namespace of its own yet: this would be the host's
            if libc.setns(theirs, CLONE_NEWNS) != 0:
                return ()
            try:
                return tuple(_mount_one(libc, mount) for mount in job.mounts)
            finally:
                if libc.setns(home, CLONE_NEWNS) != 0:
                    # Stuck in the launcher's namespace: never used again.
                    self._broken = True
                    error = _errno_error("setns")
                    log.error("could not return to floom's mount namespace: %s", error)
        finally:
            os.close(theirs)

    def _fail_all(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            job.done.set()


def _mount_one(libc: ctypes.CDLL, mount: Mount) -> bool:
    made: bool = (
        libc.mount(
            os.fsencode(mount.source),
            os.fsencode(mount.target),
            None if mount.fstype is None else os.fsencode(mount.fstype),
            ctypes.c_ulong(mount.flags),
            None if mount.data is None else os.fsencode(mount.data),
        )
        == 0
    )
    if not made:
        log.debug("mount on %s refused: %s", mount.target, os.strerror(ctypes.get_errno()))
    return made


def _libc() -> ctypes.CDLL:
    # The C library this process already has loaded (find_library would run ldconfig).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _errno_error(call: str) -> OSError:
    code = ctypes.get_errno() or errno.EPERM
    return OSError(code, f"{call}: {os.strerror(code)}")
