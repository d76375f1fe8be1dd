"""Sandbox launchers started ahead of their runs, each already inside a cgroup of its own.

Moving a process into a cgroup takes the kernel's global cgroup_threadgroup_rwsem for
writing, which first waits out an RCU grace period unless another move happened moments
before: 10-20 ms on a node that starts runs one at a time, most of floom's latency over bare
bubblewrap (bench/README.md). A process forked inside a cgroup is in it at no such cost. So
the move is made before the run arrives: a Standby keeps launchers ready, each a shell that
was moved into a fresh cgroup with no limits yet, holding the sandbox's pipes and file
descriptors, and waiting on its stdin. A run takes one, writes its limits into the cgroup
and sends the script that sets its environment and execs its command line, so everything
the run starts is in its cgroup from the first instruction.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from floom.sandbox import cgroups, seccomp
from floom.sandbox.base import ENV_NAME, SandboxUnavailable

READY: Final = 2
"""Launchers a Standby keeps ready: one for a node that starts runs one after another, one
more for two at once. A burst starts the rest on the spot, where moves come close together
and cost little."""
LAUNCHER_NAME: Final = "floom-launcher"
"""The launcher shell's name, which starts each of its own error lines."""
# A shell reads its commands from its stdin through a descriptor of its own (`.`), so the
# script can point stdin at /dev/null before it execs. Without a script (floom ended) it
# reads end-of-file and exits.
_WAIT_FOR_SCRIPT: Final = ". /dev/stdin"


@dataclass(eq=False)
class Launcher:
    """A shell waiting in its cgroup for its run's command line.

    `proc` becomes the run's first process (its pipes are the run's stdout and stderr);
    `info_fd`, `release_fd` and `resolv_conf_fd` are floom's ends of bubblewrap's
    --info-fd, --block-fd and the pipe its /etc/resolv.conf is read from; `child_fds` are
    the descriptors the command line is given, by their number in the launcher. Whoever
    takes one either starts it or discards it."""

    proc: subprocess.Popen[bytes]
    cgroup: cgroups.RunCgroup | None
    info_fd: int
    release_fd: int
    resolv_conf_fd: int
    child_fds: ChildFds

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, argv: Sequence[str], env: Mapping[str, str], *, resolv_conf: bytes) -> None:
        """Exec `argv` with exactly `env` in the launcher, the sandbox's /etc/resolv.conf to
        be `resolv_conf`. The environment goes through the shell's exports, never an argv,
        so declared secrets do not show in the host's process list. Raises
        SandboxUnavailable when the launcher is gone."""
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            resolv, self.resolv_conf_fd = self.resolv_conf_fd, -1
            with open(resolv, "wb") as file:
                file.write(resolv_conf)  # far below a pipe's buffer: this never blocks
            stdin.write(_script(argv, env))
            stdin.close()
        except OSError as exc:
            raise SandboxUnavailable(
                f"the sandbox's launcher ended before its run: {exc}",
                hint="the node may be short of memory or processes; try again",
            ) from exc

    def discard(self) -> None:
        """End the launcher and remove its cgroup."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        for fd in (self.info_fd, self.release_fd, self.resolv_conf_fd):
            if fd >= 0:
                os.close(fd)
        if self.cgroup is not None:
            self.cgroup.remove()


@dataclass(frozen=True)
class ChildFds:
    """The descriptors a launcher holds for bubblewrap, by number: its --info-fd and
    --block-fd ends (bwrap reports the sandbox's pid 1 on the first, and its command waits
    until floom closes the other, so the before-command steps finish their work on the
    sandbox's namespaces first), the sandbox's /etc/resolv.conf (--ro-bind-data), and the
    seccomp filter (--seccomp; None on an architecture floom has no syscall table for)."""

    info: int
    release: int
    resolv_conf: int
    seccomp: int | None


class Standby:
    """Keeps up to `ready` launchers started and in their cgroups; a thread of its own
    starts more when asked (`replenish`). Nothing runs until the first time it is asked."""

    def __init__(self, *, ready: int = READY) -> None:
        self._size = ready
        self._changed = threading.Condition()
        self._ready: collections.deque[Launcher] = collections.deque()
        self._filler: threading.Thread | None = None
        self._failed = False
        self._closed = False

    def take(self) -> Launcher:
        """A ready launcher, or one started now; raises SandboxUnavailable (or CgroupError
        when its cgroup cannot be made or joined)."""
        taken: Launcher | None = None
        dead: list[Launcher] = []
        with self._changed:
            while self._ready and taken is None:
                launcher = self._ready.popleft()
                if launcher.alive():
                    taken = launcher
                else:
                    dead.append(launcher)
        for launcher in dead:
            launcher.discard()
        if taken is None:
            taken = start_launcher()
        return taken

    def replenish(self) -> None:
        """Have the thread start launchers until `ready` wait again. Called once a run's
        command is under way: starting a process holds the GIL for a moment, which the
        run's own start should not wait for."""
        with self._changed:
            if not self._closed:
                self._failed = False
                if self._filler is None:
                    self._filler = threading.Thread(
                        target=self._fill, name="floom-sandbox-standby", daemon=True
                    )
                    self._filler.start()
                self._changed.notify()

    def waiting(self) -> tuple[Launcher, ...]:
        """The launchers ready now, oldest first."""
        with self._changed:
            return tuple(self._ready)

    def close(self) -> None:
        """End the ready launchers and the thread; later takes start their own."""
        with self._changed:
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
            self._changed.notify()
        for launcher in ready:
            launcher.discard()

    def _fill(self) -> None:
        while True:
            with self._changed:
                while not self._closed and (self._failed or len(self._ready) >= self._size):
                    self._changed.wait()
                if self._closed:
                    return
            try:
                launcher = start_launcher()
            except (SandboxUnavailable, cgroups.CgroupError, OSError):
                # The next run starts its own launcher and reports why; try again after it.
                with self._changed:
                    self._failed = True
                continue
            with self._changed:
                if not self._closed:
                    self._ready.append(launcher)
                    continue
            launcher.discard()
            return


def start_launcher() -> Launcher:
    """Start a launcher and move it into a new cgroup (none where no hierarchy is usable);
    raises SandboxUnavailable, or CgroupError, leaving nothing."""
    shell = shutil.which("sh")
    if shell is None:
        raise SandboxUnavailable("sh is not on PATH", hint="install dash or another POSIX sh")
    tree = cgroups.detect()
    cgroup = tree.make(f"run-{secrets.token_hex(8)}") if tree.enforced else None
    with contextlib.ExitStack() as undo:
        if cgroup is not None:
            undo.callback(cgroup.remove)
        try:
            info_r, info_w = _pipe(undo)
            release_r, release_w = _pipe(undo)
            resolv_r, resolv_w = _pipe(undo)
            seccomp_fd = _seccomp_fd()
            if seccomp_fd is not None:
                undo.callback(os.close, seccomp_fd)
            fds = ChildFds(info_w, release_r, resolv_r, seccomp_fd)
            proc = subprocess.Popen(
                [shell, "-c", _WAIT_FOR_SCRIPT, LAUNCHER_NAME],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,
                pass_fds=(info_w, release_r, resolv_r, *_present(seccomp_fd)),
            )
        except OSError as exc:  # out of descriptors, memory or processes
            raise SandboxUnavailable(
                f"could not start the sandbox's launcher: {exc}",
                hint="the node may be short of memory, processes or file descriptors; try again",
            ) from exc
        undo.pop_all()
    # The launcher holds its ends now; floom keeps only its own.
    for fd in (info_w, release_r, resolv_r, *_present(seccomp_fd)):
        os.close(fd)
    launcher = Launcher(
        proc,
        cgroup,
        info_fd=info_r,
        release_fd=release_w,
        resolv_conf_fd=resolv_w,
        child_fds=fds,
    )
    if cgroup is not None:
        try:
            cgroup.add(proc.pid)
        except cgroups.CgroupError:
            launcher.discard()
            raise
    return launcher


def _pipe(undo: contextlib.ExitStack) -> tuple[int, int]:
    """A pipe whose ends `undo` closes unless it is dismissed."""
    read_fd, write_fd = os.pipe()
    undo.callback(os.close, read_fd)
    undo.callback(os.close, write_fd)
    return read_fd, write_fd


def _script(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The launcher's commands: stdin from /dev/null, exactly `env` exported (the shell's
    own PWD unset), then exec `argv`; every value single-quoted, so none is read as shell."""
    lines = [b"exec </dev/null", b"unset PWD"]
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        lines.append(b"export " + name.encode() + b"=" + _quoted(value))
    lines.append(b"exec " + b" ".join(_quoted(arg) for arg in argv))
    return b"\n".join(lines) + b"\n"


def _quoted(value: str) -> bytes:
    raw = os.fsencode(value)
    if b"\0" in raw:
        raise ValueError("a NUL byte cannot be passed to a process")
    return b"'" + raw.replace(b"'", b"'\\''") + b"'"


def _seccomp_fd() -> int | None:
    """A file descriptor holding the seccomp filter, for bwrap's --seccomp; None on an
    architecture floom has no syscall table for."""
    if not seccomp.supported():
        return None
    fd = os.memfd_create("floom-seccomp")
    os.write(fd, seccomp.deny_filter())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _present(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)
