"""Sandbox launchers started ahead of their runs, each already inside a cgroup of its own.

Moving a process into a cgroup takes the kernel's global cgroup_threadgroup_rwsem for
writing, which first waits out an RCU grace period unless another move happened moments
before: 10-20 ms on a node that starts runs one at a time, most of floom's latency over bare
bubblewrap (bench/README.md). A process forked inside a cgroup is in it at no such cost. So
the move is made before the run arrives: a Standby keeps launchers ready, each a shell that
was moved into a fresh cgroup with no limits yet, holding the sandbox's pipes and file
descriptors, and waiting on its stdin. A run takes one, writes its limits into the cgroup
and sends the script that execs its command line, so everything the run starts is in its
cgroup from the first instruction. The launcher runs with floom's privileges: what the run
brings (its environment and command) never passes through it, but through a memory file
only the sandbox's first process reads (`Launcher.start`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from floom.errors import FloomError
from floom.sandbox.base import ENV_NAME, SandboxUnavailable
from floom.sandbox.local import cgroups, seccomp

READY: Final = 2
"""Launchers a Standby keeps ready: one for a node that starts runs one after another, one
more for two at once. A burst starts the rest on the spot, where moves come close together
and cost little."""
MAX_AGE_SECONDS: Final = 300.0
"""A launcher waits at most this long: one with a mount namespace of its own keeps the
host's mounts of its start alive (on a host whose mounts do not propagate, a volume
unmounted since would stay busy), so an idle node replaces its launchers this often."""
JOIN_SECONDS: Final = 10.0
"""How long closing waits for the thread to end the launcher it is starting."""
LAUNCHER_NAME: Final = "floom-launcher"
"""The launcher shell's name, which starts each of its own error lines."""
ENTRY_NAME: Final = "floom-run"
"""The name of the sandbox's entry shell (the first process after the drop, which reads
`command_input`), which starts its error lines: a command not found, for one."""
WAIT_FOR_SCRIPT: Final = ". /dev/stdin"
"""What a launcher's shell runs to wait for its script: it reads the commands from its stdin
through a descriptor of its own (`.`), so the script can point stdin at /dev/null before it
execs. Without a script (floom ended) it reads end-of-file and exits."""


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
    started: float = dataclasses.field(default_factory=time.monotonic)
    # Whether the script's first lines were sent ahead of the rest (`begin`).
    begun: bool = False
    # floom's descriptor of the command's input (`start`), until close_input.
    input_fd: int = -1

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sees(self, paths: Sequence[Path]) -> bool:
        """Whether each of `paths` is, in the launcher's mount namespace, the directory
        floom sees there (false for one under a mount the host made after the launcher
        started, where the host's mounts do not propagate); read through /proc, with no
        process started."""
        for path in paths:
            try:
                ours = os.stat(path)
                theirs = os.stat(f"/proc/{self.proc.pid}/root{os.path.abspath(path)}")
            except OSError:
                return False
            if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
                return False
        return True

    def begin(self, prelude: str) -> None:
        """Send the script's first lines ahead of the rest: stdin from /dev/null, then the
        shell lines `prelude` (floom's own), which the launcher runs while floom prepares
        the rest for `start`. Raises SandboxUnavailable when the launcher is gone."""
        stdin = self.proc.stdin
        assert stdin is not None
        assert not self.begun
        try:
            stdin.write(launcher_head(prelude))
            stdin.flush()
        except OSError as exc:
            raise self._gone(exc) from exc
        self.begun = True

    def start(
        self,
        argv: Sequence[str],
        command_input: bytes,
        *,
        resolv_conf: bytes,
        prelude: str = "",
    ) -> None:
        """Run the shell lines `prelude` (floom's own), then exec `argv` with an empty
        environment and, as its stdin, a memory file holding `command_input` (/dev/null when
        empty), the sandbox's /etc/resolv.conf to be `resolv_conf`. The launcher only opens
        that file, by its path in floom's /proc: what the run brings (its environment,
        its command) is read by the sandbox's first process alone, after the drop
        (`command_input`), never by a process with the launcher's privileges, nor shown
        in the host's process list. Raises SandboxUnavailable when the launcher is gone."""
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            resolv, self.resolv_conf_fd = self.resolv_conf_fd, -1
            with open(resolv, "wb") as file:
                file.write(resolv_conf)  # far below a pipe's buffer: this never blocks
            source = "/dev/null"
            if command_input:
                self.input_fd = memory_file(command_input)
                source = f"/proc/{os.getpid()}/fd/{self.input_fd}"
            head = b"" if self.begun else launcher_head()
            stdin.write(head + launcher_rest(argv, stdin=source, prelude=prelude))
            stdin.close()
        except OSError as exc:
            raise self._gone(exc) from exc

    def close_input(self) -> None:
        """Let go of floom's end of the command's input (`start`), once the launcher has
        opened it or will not: when the run ended or was discarded."""
        fd, self.input_fd = self.input_fd, -1
        if fd >= 0:
            os.close(fd)

    def _gone(self, exc: OSError) -> SandboxUnavailable:
        return SandboxUnavailable(
            f"the sandbox's launcher ended before its run: {self._last_words() or exc}",
            hint="the node may be short of memory or processes; try again",
        )

    def _last_words(self) -> str:
        """The first line the launcher printed on stderr before it ended, if it has."""
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read(4096).decode("utf-8", "replace").strip().split("\n")[0]

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
        self.close_input()
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

    def __init__(
        self, *, ready: int = READY, command: Callable[[], list[str]] | None = None
    ) -> None:
        """`command` builds a launcher's command line (plain_launcher by default)."""
        self._size = ready
        self._command = command or plain_launcher
        self._changed = threading.Condition()
        self._ready: collections.deque[Launcher] = collections.deque()
        self._filler: threading.Thread | None = None
        self._failed = False
        self._closed = False

    def take(self, *, seeing: Sequence[Path] = ()) -> Launcher:
        """A ready launcher that sees `seeing` as floom does (Launcher.sees), or one started
        now; raises SandboxUnavailable, what the command raises, or CgroupError when the
        cgroup cannot be made or joined."""
        taken: Launcher | None = None
        dropped: list[Launcher] = []
        with self._changed:
            while self._ready and taken is None:
                launcher = self._ready.popleft()
                fresh = time.monotonic() - launcher.started < MAX_AGE_SECONDS
                if fresh and launcher.alive() and launcher.sees(seeing):
                    taken = launcher
                else:
                    dropped.append(launcher)
        for launcher in dropped:
            launcher.discard()
        if taken is None:
            taken = start_launcher(self._command)
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
        """End the ready launchers and the thread (a launcher it is starting is ended before
        this returns); later takes start their own."""
        with self._changed:
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
            filler = self._filler
            self._changed.notify()
        for launcher in ready:
            launcher.discard()
        if filler is not None and filler is not threading.current_thread():
            filler.join(JOIN_SECONDS)

    def _fill(self) -> None:
        while True:
            with self._changed:
                while not self._closed:
                    stale = self._stale()
                    if stale or not (self._failed or len(self._ready) >= self._size):
                        break
                    oldest = self._ready[0].started if self._ready else time.monotonic()
                    self._changed.wait(max(0.0, oldest + MAX_AGE_SECONDS - time.monotonic()))
                if self._closed:
                    return
            for launcher in stale:
                launcher.discard()
            if self._failed or len(self._ready) >= self._size:
                continue
            try:
                launcher = start_launcher(self._command)
            except (FloomError, OSError):
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

    def _stale(self) -> list[Launcher]:
        """Take the launchers past MAX_AGE_SECONDS out of the ready ones (under the lock)."""
        now = time.monotonic()
        stale = [launcher for launcher in self._ready if now - launcher.started >= MAX_AGE_SECONDS]
        for launcher in stale:
            self._ready.remove(launcher)
        return stale


def plain_launcher() -> list[str]:
    """The command line of a launcher that needs nothing before its script: a shell."""
    shell = shutil.which("sh")
    if shell is None:
        raise SandboxUnavailable("sh is not on PATH", hint="install dash or another POSIX sh")
    return [shell, "-c", WAIT_FOR_SCRIPT, LAUNCHER_NAME]


def start_launcher(command: Callable[[], list[str]] = plain_launcher) -> Launcher:
    """Start a launcher (the command line `command` builds, which runs WAIT_FOR_SCRIPT) and
    move it into a new cgroup (none where no hierarchy is usable); raises
    SandboxUnavailable, or what `command` raises, or CgroupError, leaving nothing."""
    argv = command()
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
                argv,
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


def launcher_script(argv: Sequence[str], *, stdin: str, prelude: str = "") -> bytes:
    """A launcher's commands: stdin from /dev/null, the shell's own PWD unset, `prelude`,
    then exec `argv` with its stdin opened from the path `stdin`; every word single-quoted,
    so none is read as shell. The launcher exports nothing: `argv` starts with an empty
    environment. `launcher_head` and `launcher_rest` are its two parts, when sent apart."""
    return launcher_head() + launcher_rest(argv, stdin=stdin, prelude=prelude)


def launcher_head(prelude: str = "") -> bytes:
    """The script's first lines: stdin from /dev/null, the shell's own PWD unset, then
    `prelude`."""
    return _lines([b"exec </dev/null", b"unset PWD", prelude.encode().rstrip(b"\n")])


def launcher_rest(argv: Sequence[str], *, stdin: str, prelude: str = "") -> bytes:
    """The rest of the script after `launcher_head`: `prelude`, then exec `argv` with its
    stdin opened from the path `stdin` (floom's, never the run's)."""
    words = b" ".join(_quoted_arg(arg) for arg in argv)
    return _lines([prelude.encode().rstrip(b"\n"), b"exec <" + _quoted(stdin) + b" " + words])


def command_input(env: Mapping[str, str], command: Sequence[str]) -> bytes:
    """What a sandbox's first process, a POSIX shell, sources from its stdin after the
    privilege drop: exactly `env` exported, and `command` as its positional parameters
    (`set --`), for it to exec; every value single-quoted, so none is read as shell.
    Raises ValueError for a name no shell can export or a NUL in a value."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        lines.append(b"export " + name.encode() + b"=" + _quoted(value))
    lines.append(b"set -- " + b" ".join(_quoted(arg) for arg in command))
    return _lines(lines)


def _lines(lines: Sequence[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines if line)


def _quoted(value: str) -> bytes:
    raw = os.fsencode(value)
    if b"\0" in raw:
        raise ValueError("a NUL byte cannot be passed to a process")
    return b"'" + raw.replace(b"'", b"'\\''") + b"'"


@functools.lru_cache(maxsize=4096)
def _quoted_arg(arg: str) -> bytes:
    """_quoted, remembered: bubblewrap's command line is about a hundred words, nearly all
    the same from run to run. Only for a command line, which holds no secret (the process list
    shows it); the environment's values are quoted afresh each time and never kept."""
    return _quoted(arg)


def memory_file(data: bytes) -> int:
    """A descriptor of floom's (close-on-exec) on an anonymous memory file holding `data`:
    no size limit to block on, as a pipe's buffer would, and nothing on any filesystem."""
    fd = os.memfd_create("floom-run")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


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
