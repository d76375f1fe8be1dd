"""A run's overlay mounted from floom's own process, in its launcher's mount namespace.

A root floom lays each run's work dir over the version's cached files with an overlay
mounted on the launcher's stage (floom/sandbox/identity.py). Exec'ing mount(8) for it costs
about 1.1 ms on the run's path. Instead, one thread of floom's, with filesystem attributes of
its own (unshare CLONE_FS, without which a threaded process may not change its mount
namespace), enters the launcher's mount namespace (setns), calls mount(2), and goes back.

Whatever it cannot do is left to the launcher's script, as before: the caller gets False
when the launcher is not in a namespace of its own yet (the mount would land on the host),
when the kernel refuses, or when the thread is unusable. A thread that could not go back to
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
WAIT_SECONDS: Final = 5.0
"""How long a caller waits for the thread to start on its mount; after that the mount is
abandoned (never made later) and the launcher's script makes it."""


@dataclass
class PendingMount:
    """An overlay mount handed to the thread; `wait` says whether it was made."""

    pid: int
    options: str
    target: str
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    abandoned: bool = False
    mounted: bool = False

    def wait(self) -> bool:
        """True once mounted; False when it was not, or when the thread did not start on it
        in WAIT_SECONDS (it then never will: two overlays on one upper dir refuse each
        other)."""
        if not self.done.wait(WAIT_SECONDS):
            with self.lock:
                if not self.started:
                    self.abandoned = True
                    return False
            self.done.wait()
        return self.mounted


class OverlayMounter:
    """Mounts overlays in other processes' mount namespaces from one thread of this process,
    started on first use."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[PendingMount] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._broken = False

    def start(self, pid: int, options: str, target: str) -> PendingMount:
        """Have the thread mount an overlay with `options` (lowerdir, upperdir, workdir) on
        `target` in the mount namespace of process `pid`, a child of floom's that has one of
        its own; the caller goes on and `wait`s for it later (False: not mounted, the caller
        mounts it another way)."""
        job = PendingMount(pid, options, target)
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
            log.warning("mounting overlays from floom's process is unavailable: %s", exc)
            self._broken = True
            self._fail_all()
            return
        while not self._broken:
            job = self._jobs.get()
            try:
                with job.lock:
                    job.started = not job.abandoned
                if job.started:
                    job.mounted = self._mount(libc, home, job)
            finally:
                job.done.set()
        self._fail_all()

    def _mount(self, libc: ctypes.CDLL, home: int, job: PendingMount) -> bool:
        try:
            theirs = os.open(f"/proc/{job.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False  # it ended
        try:
            if os.fstat(theirs).st_ino == os.fstat(home).st_ino:
                return False  # not in a namespace of its own yet: this would be the host's
            if libc.setns(theirs, CLONE_NEWNS) != 0:
                return False
            try:
                mounted = (
                    libc.mount(
                        b"floom-work",
                        os.fsencode(job.target),
                        b"overlay",
                        ctypes.c_ulong(0),
                        os.fsencode(job.options),
                    )
                    == 0
                )
                if not mounted:
                    log.debug("overlay mount refused: %s", os.strerror(ctypes.get_errno()))
                return mounted
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
