"""A warm process seen from the host: a pre-initialised interpreter under bubblewrap, and the
children it prepares for runs (floom/sandbox/local/warm/inside.py is what runs inside).

The warm process is root only in a user namespace of its own, whose root is a host uid of
the sandbox uid pool that no run has (leased for the warm process's life): on the host it
holds no capability, and its namespace maps only that uid and the rest of the pool, so
its capabilities there (namespaces, mounts, the switch to a run's uid, loopback) reach no
file, process or resource of the host's but the pool's. It holds nothing of any run: no run
dir, no secret, no input, no network, no file of a worker's bundle. It has a PID namespace
of its own: it sees (and can signal, or reach the root of) no process of the host nor any other
sandbox's; its runs' PID namespaces are nested in it. That namespace's pid 1 only reaps
(inside.py `_stay_init`): a run outlives its warm process's death, and the namespace, with
every run in it, ends when bubblewrap is killed. Its control socket is one end
of a socketpair floom made and handed over; each child gets a socketpair of its own the
same way, which its run's pid 1 closes before the script starts: no run reaches any
socket but those of its own output. Where the kernel keeps a process's exit status for its
pidfd (Linux 6.15+), each run's pid 1 is the warm process's own child and floom reads its
end from its pidfd; elsewhere a second process per run reaps pid 1 and reports. The warm
process names its processes to floom by pidfds: its pids mean nothing on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from floom.sandbox.base import SandboxUnavailable
from floom.sandbox.local import cgroups, procfs, seccomp
from floom.sandbox.local.identity import FILES_OWNER
from floom.sandbox.local.network import OFFLINE_RESOLV_CONF
from floom.sandbox.local.uid_pool import UidLease, UidPool, UidRange

log = logging.getLogger("floom.sandbox")

INSIDE: Final = Path(__file__).with_name("inside.py")
MAX_MESSAGE: Final = 65536
START_SECONDS: Final = 30.0
"""How long a warm process may take to import its modules and say it is ready."""
REPLY_SECONDS: Final = 5.0
"""How long a child may take to answer one request (prepare, set up) before it is dropped."""
REAP_WAIT_SECONDS: Final = 1.0
"""How long freeing a child waits for its processes, killed already, to exit, to reap those
that were handed to floom (procfs.reap_if_ours)."""
KILLED_INIT_SECONDS: Final = 10.0
"""How long ending a warm process waits, once its bubblewrap is reaped, for its PID
namespace's pid 1 to exit, to reap it should it have been handed to floom: by then it has
exited with bubblewrap, or was killed by its parent-death signal (the kernel hands it over
before it sends that), so it exits; the bound only keeps a stuck kernel from holding a
node's stop."""
WARM_MARK: Final = "floom-warm:"
"""Starts the word of a warm process's command line that names its owner (kill_orphans)."""
CAPABILITIES: Final = (  # in its own user namespace, none on the host
    "CAP_SYS_ADMIN",  # namespaces, mounts, hostname
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_SETPCAP",  # empty the bounding set
    "CAP_NET_ADMIN",  # the run's loopback up
    "CAP_DAC_OVERRIDE",  # the overlay over a run's dirs, which its own uid owns
    "CAP_FOWNER",
    "CAP_CHOWN",  # the overlay's copy-up gives a version file's copy its owner (nobody)
)
WARM_ENV: Final = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}
"""The warm process's environment; -u and -B stand for the cold path's PYTHONUNBUFFERED and
PYTHONDONTWRITEBYTECODE, which each run also gets in its own environment."""
INTERPRETER_FLAGS: Final = ("-u", "-B")
_SYS_OPEN_TREE: Final = 428  # one number on every architecture since Linux 5.2
_OPEN_TREE_CLONE: Final = 1
_AT_FDCWD: Final = -100
_AT_SYMLINK_NOFOLLOW: Final = 0x100  # a link in a run's dir is never followed
_PIDFD_GET_INFO: Final = 0xC040FF0B  # _IOWR(0xFF, 11, the first 64 bytes of pidfd_info)
_PIDFD_INFO_EXIT: Final = 0x8
_PIDFD_INFO_SIZE: Final = 64
_PIDFD_INFO_EXIT_CODE_AT: Final = 60


class WarmUnavailable(SandboxUnavailable):
    """A warm process or child could not be started or did not answer: the run starts cold."""


@dataclass(eq=False)
class PreparedChild:
    """A child of a warm process waiting for its run: in its cgroup (no limits yet), in its
    own namespaces, its pid 1 forked. `init_pid` is pid 1's host pid (the script's),
    `child_pid` the process that reaps it and reports its status on `chan`, or -1 (with
    `child_pidfd`) where floom reads pid 1's status from `init_pidfd`."""

    chan: socket.socket
    stdout: int
    stderr: int
    cgroup: cgroups.RunCgroup | None
    child_pid: int
    init_pid: int
    init_pidfd: int
    child_pidfd: int
    made: float = field(default_factory=time.monotonic)
    closed: bool = False

    def ask(self, message: dict[str, object], fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        try:
            if fds:
                socket.send_fds(self.chan, [data], fds)
            else:
                self.chan.send(data)
        except OSError as exc:
            raise WarmUnavailable(f"the warm run's child is gone: {exc}") from exc

    def answer(self, timeout: float = REPLY_SECONDS) -> dict[str, object]:
        """The child's next message; raises WarmUnavailable when none comes in time."""
        ready, _, _ = select.select([self.chan], [], [], timeout)
        if not ready:
            raise WarmUnavailable("the warm run's child did not answer")
        try:
            data = self.chan.recv(MAX_MESSAGE)
        except OSError as exc:
            raise WarmUnavailable(f"the warm run's child is gone: {exc}") from exc
        if not data:
            raise WarmUnavailable("the warm run's child ended")
        return _message(data, "the warm run's child")

    def alive(self) -> bool:
        ready, _, _ = select.select([self.init_pidfd], [], [], 0)
        return not ready

    @property
    def reports(self) -> bool:
        """Whether a process of the child reports pid 1's status on `chan`."""
        return self.child_pid >= 0

    def init_status(self, timeout: float) -> int | None:
        """pid 1's wait status once it has ended: from its pidfd once it is reaped (at once,
        by its warm process), or from /proc while it is a zombie (its warm process died and
        what adopted it reaps late, or never: a floom that is its container's pid 1); None
        if neither tells within `timeout`."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while (status := self._ended_status()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        return status

    def _ended_status(self) -> int | None:
        status = exit_status(self.init_pidfd)
        if status is None and (status := procfs.zombie_status(self.init_pid)) is not None:
            # Read again from the pidfd if it was reaped meanwhile: the pid may be another's.
            again = exit_status(self.init_pidfd)
            status = again if again is not None else status
        return status

    def await_reporter(self, timeout: float) -> None:
        """Wait until the process that reported pid 1's status has exited too: its cgroup
        can be removed at once then, not after a kill and a retry."""
        if self.child_pidfd >= 0:
            select.select([self.child_pidfd], [], [], timeout)

    def discard(self) -> None:
        """Kill the child's processes and free what it holds (a child never used)."""
        self.discard_processes()
        self.close_fds()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    def discard_processes(self) -> None:
        """Kill the child's processes, by their pidfds (never by a pid that may be reused)."""
        for pidfd in (self.init_pidfd, self.child_pidfd):
            if pidfd >= 0:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def close_fds(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pidfd in (self.child_pidfd, self.init_pidfd):
            # Killed by now; one handed to floom (its warm process gone) is reaped here.
            if pidfd >= 0:
                procfs.reap_if_ours(pidfd, REAP_WAIT_SECONDS)
        for fd in (self.stdout, self.stderr, self.init_pidfd, self.child_pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.stdout = self.stderr = self.init_pidfd = self.child_pidfd = -1
        self.chan.close()


class WarmProcess:
    """One warm process: bubblewrap running inside.py's `warm` with `modules` preloaded."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        control: socket.socket,
        *,
        modules: tuple[str, ...],
        pidfd: int,
        init_pidfd: int,
        direct: bool,
        lease: UidLease,
    ) -> None:
        self.proc = proc
        self.lease = lease  # its user namespace's root: given back once that has ended
        self.control = control
        self.modules = modules
        self.direct = direct  # each run's pid 1 is its own child (no reporter)
        # The interpreter, and its PID namespace's pid 1 (bwrap is proc.pid): their pidfds,
        # held while this object lives, and the interpreter's pid on the host.
        self.pidfd = pidfd
        self.init_pidfd = init_pidfd
        self.pid = procfs.pid_of(pidfd)
        self.init_pid = procfs.pid_of(init_pidfd)
        for fd in (pidfd, init_pidfd):
            weakref.finalize(self, _close_quietly, fd)
        self.started = time.monotonic()
        self.served = 0
        self._lock = threading.Lock()

    @classmethod
    def launch(
        cls,
        *,
        modules: tuple[str, ...],
        owner: str,
        system_args: tuple[str, ...],
        source: str,
        uids: UidPool,
    ) -> Launching:
        """Start a warm process, root of a user namespace of its own mapped to a uid taken
        from `uids` (the namespace maps the rest of the pool too, for its runs); its `ready`
        waits until its modules are imported (from any thread: the thread that launches it
        must outlive it, as bubblewrap dies with that thread)."""
        bwrap = shutil.which("bwrap")
        python = shutil.which("python3", path=WARM_ENV["PATH"])
        if bwrap is None or python is None:
            raise WarmUnavailable("bwrap or python3 is not on PATH")
        # Given back by `_launch` once it fails, or by what ends the warm process.
        lease = uids.take()
        return cls._launch(bwrap, python, modules, owner, system_args, source, lease, uids.uids)

    @classmethod
    def _launch(
        cls,
        bwrap: str,
        python: str,
        modules: tuple[str, ...],
        owner: str,
        system_args: tuple[str, ...],
        source: str,
        lease: UidLease,
        pool: UidRange,
    ) -> Launching:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            lease.release()
            raise WarmUnavailable(f"cannot start a warm process: {exc}") from exc
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        resolv = os.memfd_create("floom-resolv")
        os.write(resolv, OFFLINE_RESOLV_CONF)
        os.lseek(resolv, 0, os.SEEK_SET)
        caps: list[str] = ["--cap-drop", "ALL"]
        for cap in CAPABILITIES:
            caps += ["--cap-add", cap]
        filter_hex = seccomp.deny_filter(namespaces=True).hex() if seccomp.supported() else ""
        direct = pidfd_exit_supported()
        argv = [
            bwrap,
            # Its own user namespace, whose maps floom writes (`_map_namespace`) while
            # bubblewrap waits on the block fd; its root there is the lease's uid.
            *("--unshare-user", "--uid", "0", "--gid", "0"),
            *("--userns-block-fd", str(block_r), "--info-fd", str(info_w)),
            *("--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
            *("--unshare-pid", "--as-pid-1"),  # pid 1 is inside.py's own reaper
            *("--die-with-parent", "--new-session", *caps),
            *system_args,
            *("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"),
            *("--dir", "/work", "--dir", "/output"),
            *("--dir", "/run/floom-warm/files", "--dir", "/run/floom-warm/run"),
            *("--ro-bind-data", str(resolv), "/etc/resolv.conf"),
            *("--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/"),
            "--",
            python,
            *INTERPRETER_FLAGS,
            "-c",
            source,
            "warm",
            str(theirs.fileno()),
            filter_hex,
            "direct" if direct else "report",
            ",".join(modules),
            owner,
        ]
        try:
            # bubblewrap itself runs as the lease's uid, with no capability on the host and
            # no supplementary group (none is left for its runs to inherit either).
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=dict(WARM_ENV),
                pass_fds=(theirs.fileno(), resolv, info_w, block_r),
                start_new_session=True,
                user=lease.uid,
                group=lease.uid,
                extra_groups=[],
            )
        except OSError as exc:
            ours.close()
            _close_all([info_r, block_w])
            lease.release()  # nothing ran as its uid
            raise WarmUnavailable(f"cannot start a warm process: {exc}") from exc
        finally:
            theirs.close()
            _close_all([resolv, info_w, block_r])
        init_pidfd = -1
        try:
            init_pidfd = _child_pidfd(proc, info_r)
            _map_namespace(init_pidfd, block_w, lease.uid, pool)
        except BaseException:
            _end(proc, ours)
            _release_when_ended(lease, init_pidfd)
            _close_quietly(init_pidfd)
            raise
        finally:
            _close_all([info_r, block_w])
        return Launching(proc, ours, modules, direct, lease, init_pidfd)

    def alive(self) -> bool:
        """Whether the interpreter still serves (its namespace may outlive it, for its runs)."""
        if self.proc.poll() is not None:
            return False
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return not ready

    def prepare(
        self,
        count: int = 1,
        *,
        memory_bytes: int = 0,
        each: Callable[[PreparedChild], None] | None = None,
    ) -> list[PreparedChild]:
        """`count` children, each for one run in a fresh cgroup of its own (limits written
        when its run comes), its /tmp and /dev/shm mounted ahead at `memory_bytes` (the
        version's memory limit; 0: once its run comes). Asked for all at once: their moves
        into their cgroups come close together, where the kernel makes them cheap
        (floom/sandbox/local/standby.py).
        Returns those that got ready (raising WarmUnavailable, or CgroupError, when none
        did), leaving nothing of the others; `each` is given each as soon as it is ready
        (a run waiting for one need not wait for the others)."""
        pending: list[_Pending] = []
        failure: Exception | None = None
        try:
            for _ in range(count):
                pending.append(self._ask_for_child(memory_bytes))
        except (WarmUnavailable, cgroups.CgroupError) as exc:
            failure = exc
        children: list[PreparedChild] = []
        for asked in pending:
            try:
                child = asked.ready()
            except WarmUnavailable as exc:
                failure = exc
                continue
            children.append(child)
            self.served += 1
            if each is not None:
                each(child)
        if not children and failure is not None:
            raise failure
        return children

    def _ask_for_child(self, memory_bytes: int) -> _Pending:
        tree = cgroups.detect()
        cgroup = tree.make(f"run-{secrets.token_hex(8)}") if tree.enforced else None
        undo = contextlib.ExitStack()
        with undo:
            if cgroup is not None:
                undo.callback(cgroup.remove)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            undo.callback(ours.close)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            for fd in (out_r, err_r):
                undo.callback(_close_quietly, fd)
            given = [theirs.fileno(), out_w, err_w]
            procs: list[int] = []
            try:
                for path in dict.fromkeys(cgroup.dirs.values()) if cgroup else ():
                    procs.append(os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
                with self._lock:
                    request = json.dumps({"op": "prepare", "memory_bytes": memory_bytes})
                    socket.send_fds(self.control, [request.encode()], [*given, *procs])
            except OSError as exc:
                raise WarmUnavailable(f"the warm process is gone: {exc}") from exc
            finally:
                theirs.close()
                for fd in (out_w, err_w, *procs):
                    os.close(fd)
            return _Pending(ours, out_r, err_r, cgroup, undo.pop_all())

    def _has_children(self) -> bool:
        """Whether a run's pid 1 (or the process reporting one) is left in the namespace: a
        child of the interpreter, or, once the interpreter died, of the namespace's pid 1,
        which its children were handed to (until pid 1 reaps it, a dead interpreter lists
        none of them). True when unknown."""
        found: set[str] = set()
        for pid in (self.pid, self.init_pid):
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    found.update(children.read().split())
            except OSError:
                if pid == self.init_pid:
                    return True
        found.discard(str(self.pid))
        return bool(found)

    def rss_bytes(self) -> int:
        """The interpreter's resident memory (what its children share until they write)."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return 0

    def close(self, *, now: bool = False) -> None:
        """End the warm process; the runs it prepared go on. While it has children (their
        pid 1s, or the processes that report them) it ends on its own once they have (its
        control socket closed tells it), and a thread reaps it then; `now` (the node stops)
        kills it at once, and with its PID namespace every run in it."""
        if now or not self._has_children():
            _end(self.proc, self.control)
            _namespace_ended(self.init_pidfd, self.lease)
            return
        self.control.close()
        reaper = threading.Thread(
            target=_reap, args=(self.proc,), name="floom-warm-reap", daemon=True
        )
        with _closing_lock:
            _closing[self.proc] = (os.dup(self.init_pidfd), self.lease)
            _reapers[self.proc] = reaper
        reaper.start()


@dataclass(eq=False)
class Launching:
    """A warm process started and not ready yet: exactly one of `ready` and `close` ends
    this; `abort`, from any thread, makes a `ready` under way end at once."""

    proc: subprocess.Popen[bytes]
    control: socket.socket
    modules: tuple[str, ...]
    direct: bool
    lease: UidLease
    init_pidfd: int
    """Its PID namespace's pid 1 (bubblewrap's child), known from bubblewrap's info."""
    _settled: bool = False
    """Set, under `_lock`, before anything reaps bubblewrap or hands it on: `abort` never
    signals a pid that may have been reaped (and reused)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def abort(self) -> None:
        """Kill bubblewrap (and with it the sandbox it started) unless `ready` or `close`
        has settled it already; `ready` then raises WarmUnavailable and reaps it."""
        with self._lock:
            if not self._settled:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)

    def _settle(self) -> None:
        with self._lock:
            self._settled = True

    def ready(self) -> WarmProcess:
        """The warm process once its modules are imported; raises WarmUnavailable (with
        `refused` naming a module that started a thread), leaving nothing running."""
        proc, ours = self.proc, self.control
        try:
            message, fds = _read_message(ours, START_SECONDS, fds=2)
        except WarmUnavailable as exc:
            exc.details = {"stderr": _tail(proc)}
            self.close()
            raise
        if "refused" in message:
            _close_all(fds)
            self.close()
            failure = WarmUnavailable(f"module {message['refused']} starts a thread")
            failure.details = {"refused": str(message["refused"])}
            raise failure
        try:
            if message.get("ready") is not True or len(fds) != 2:
                raise WarmUnavailable("the warm process did not say it was ready")
            # fds[1] is pid 1's pidfd, as the namespace sees it: floom's own stands for it.
            _close_quietly(fds.pop())
            self._settle()
            return WarmProcess(
                proc,
                ours,
                modules=self.modules,
                pidfd=fds[0],
                init_pidfd=self.init_pidfd,
                direct=self.direct,
                lease=self.lease,
            )
        except (WarmUnavailable, OSError) as exc:
            _close_all(fds)
            self.close()
            if isinstance(exc, WarmUnavailable):
                raise
            raise WarmUnavailable(f"the warm process is gone: {exc}") from exc

    def close(self) -> None:
        self._settle()
        _end(self.proc, self.control)
        _release_when_ended(self.lease, self.init_pidfd)
        _close_quietly(self.init_pidfd)


@dataclass(eq=False)
class _Pending:
    """A child asked for and not ready yet; `undo` frees what it holds."""

    chan: socket.socket
    stdout: int
    stderr: int
    cgroup: cgroups.RunCgroup | None
    undo: contextlib.ExitStack

    def ready(self) -> PreparedChild:
        """The child, once it says it is ready; raises WarmUnavailable, leaving nothing."""
        with self.undo as undo:
            message, fds = _read_message(self.chan, REPLY_SECONDS, fds=2)
            undo.callback(_close_all, fds)
            # pid 1's pidfd, after that of the process reporting it where there is one.
            if message.get("ready") is not True or not fds:
                raise WarmUnavailable("the warm run's child did not say it was ready")
            pidfd, child_pidfd = fds[-1], (fds[0] if len(fds) == 2 else -1)
            try:
                init_pid = procfs.pid_of(pidfd)
                child_pid = procfs.pid_of(child_pidfd) if child_pidfd >= 0 else -1
            except OSError as exc:
                raise WarmUnavailable(f"the warm run's child is gone: {exc}") from exc
            undo.pop_all()
        return PreparedChild(
            self.chan,
            self.stdout,
            self.stderr,
            self.cgroup,
            child_pid,
            init_pid,
            pidfd,
            child_pidfd,
        )


def open_detached(path: Path) -> int:
    """A detached copy of the mount at `path` (open_tree with OPEN_TREE_CLONE): a run's
    pid 1 moves it into its own namespace, where no host path names it."""
    fd = int(
        _libc().syscall(
            _SYS_OPEN_TREE,
            _AT_FDCWD,
            os.fsencode(path),
            _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_SYMLINK_NOFOLLOW,
        )
    )
    if fd < 0:
        code = ctypes.get_errno() or errno.EPERM
        raise OSError(code, f"open_tree {path}: {os.strerror(code)}")
    return fd


def exit_status(pidfd: int) -> int | None:
    """The wait status of the ended process behind `pidfd`, once the kernel has it (Linux
    6.15+, once the process is reaped); None before, or on older kernels."""
    info = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("=Q", info, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info)
    except OSError:
        return None
    if not struct.unpack_from("=Q", info, 0)[0] & _PIDFD_INFO_EXIT:
        return None
    return int(struct.unpack_from("=i", info, _PIDFD_INFO_EXIT_CODE_AT)[0])


@functools.cache
def pidfd_exit_supported() -> bool:
    """Whether this kernel keeps an ended process's exit status for its pidfd (asked once,
    of a process of floom's own that exits with code 3)."""
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", "exit 3"], stdin=subprocess.DEVNULL, close_fds=True
        )
    except OSError:
        return False
    try:
        pidfd = os.pidfd_open(proc.pid)  # its pid is not reused before the wait below
    except OSError:
        proc.wait()
        return False
    try:
        proc.wait()
        status = exit_status(pidfd)
    finally:
        os.close(pidfd)
    return status is not None and os.waitstatus_to_exitcode(status) == 3


_closing: dict[subprocess.Popen[bytes], tuple[int, UidLease]] = {}
"""The bubblewraps of warm processes closed and ending on their own after their runs, with a
pidfd of their PID namespace's pid 1 each and the lease of their user namespace's root
(closed and given back by whichever of `_reap` and `end_closing` takes them out)."""
_reapers: dict[subprocess.Popen[bytes], threading.Thread] = {}
"""The threads reaping those (`_reap`), until each is done: `end_closing` waits for them."""
_closing_lock = threading.Lock()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait()
        with _closing_lock:
            init_pidfd, lease = _closing.pop(proc, (-1, None))
        if lease is not None:
            _namespace_ended(init_pidfd, lease)
            _close_quietly(init_pidfd)
        if proc.stderr is not None:
            with contextlib.suppress(OSError):
                proc.stderr.close()
    finally:
        with _closing_lock:
            _reapers.pop(proc, None)


def _namespace_ended(init_pidfd: int, lease: UidLease) -> None:
    """After a warm process's bubblewrap was reaped: its PID namespace's pid 1 was reaped by
    bubblewrap, or, where bubblewrap ended first (killed, or the thread that started it
    ended: its parent-death signal), handed to floom when floom reaps orphans (its
    container's pid 1) and killed: reaped here then, not left a zombie. Then the uid is
    given back."""
    procfs.reap_if_ours(init_pidfd, KILLED_INIT_SECONDS)
    _release_when_ended(lease, init_pidfd)


def end_closing(token: str) -> None:
    """Kill now, and reap, the warm processes whose owner marker ends with `token` that were
    closed and are still ending on their own (the node stops); returns once those a reaping
    thread took out are reaped too."""
    with _closing_lock:
        procs = [
            (p, _closing.pop(p))
            for p in list(_closing)
            if str(p.args[-1]).endswith(token)  # type: ignore[index]
        ]
        reapers = [
            t
            for p, t in _reapers.items()
            if str(p.args[-1]).endswith(token)  # type: ignore[index]
        ]
    for proc, (init_pidfd, lease) in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
        _namespace_ended(init_pidfd, lease)
        os.close(init_pidfd)
    # Those a reaping thread took out are being ended by it: each is past its bubblewrap's
    # wait (or that bubblewrap was reaped just above), so it ends within its bounded waits.
    for reaper in reapers:
        reaper.join(KILLED_INIT_SECONDS + 2 * REAP_WAIT_SECONDS)
        if reaper.is_alive():
            log.warning("a warm process's reaping thread did not end in time")


def _child_pidfd(proc: subprocess.Popen[bytes], info_r: int) -> int:
    """A pidfd of bubblewrap's child (its PID namespace's pid 1, waiting for its user
    namespace's maps), named in the info bubblewrap writes first; raises WarmUnavailable
    when none comes in time."""
    info = b""
    deadline = time.monotonic() + REPLY_SECONDS
    while True:
        ready, _, _ = select.select([info_r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(info_r, 4096) if ready else b""
        if not chunk or len(info) > MAX_MESSAGE:
            raise WarmUnavailable(f"bubblewrap did not start the warm process: {_tail(proc)}")
        info += chunk
        try:
            found = json.loads(info)
        except ValueError:
            continue  # not all of it yet
        child = found.get("child-pid") if isinstance(found, dict) else None
        if not isinstance(child, int) or child <= 1:
            raise WarmUnavailable("bubblewrap named no child")
        try:
            return os.pidfd_open(child)  # not reaped before floom writes its maps
        except OSError as exc:
            raise WarmUnavailable(f"the warm process is gone: {exc}") from exc


def _map_namespace(pidfd: int, block_w: int, root: int, pool: UidRange) -> None:
    """Map the user namespace of bubblewrap's child `pidfd` (it waits on `block_w`
    meanwhile): its root to host uid `root`, the pool's other uids to themselves (its runs'
    own), and no other, with setgroups denied; then let it go on."""
    try:
        pid = procfs.pid_of(pidfd)
        for name, data in (
            ("uid_map", namespace_map(root, pool)),
            ("setgroups", b"deny"),
            ("gid_map", namespace_map(root, pool)),
        ):
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data)  # one write: the kernel takes a map whole or not at all
            finally:
                os.close(fd)
        if select.select([pidfd], [], [], 0)[0]:
            raise WarmUnavailable("the warm process ended before its maps were written")
        os.write(block_w, b"1")
    except OSError as exc:
        raise WarmUnavailable(f"cannot map the warm process's user namespace: {exc}") from exc


def namespace_map(root: int, pool: UidRange) -> bytes:
    """A warm process's uid (and gid) map: 0 to `root`, every other uid of `pool` to itself."""
    lines = [f"0 {root} 1"]
    if not pool.base <= FILES_OWNER <= pool.last:  # a pool never holds nobody (UidRange)
        lines.append(f"{FILES_OWNER} {FILES_OWNER} 1")
    if root > pool.base:
        lines.append(f"{pool.base} {pool.base} {root - pool.base}")
    if root < pool.last:
        lines.append(f"{root + 1} {root + 1} {pool.last - root}")
    return ("\n".join(lines) + "\n").encode()


def _release_when_ended(lease: UidLease, init_pidfd: int) -> None:
    """Give a warm process's uid back once its PID namespace has ended (every process that
    ran as it did: bubblewrap, reaped by then, and the namespace's); else it stays taken
    until floom exits, as a cold run's does."""
    if init_pidfd >= 0 and select.select([init_pidfd], [], [], REAP_WAIT_SECONDS)[0]:
        lease.release()
    else:
        log.warning("a warm process's uid %d stays taken: its namespace did not end", lease.uid)


def _read_message(
    sock: socket.socket, timeout: float, *, fds: int
) -> tuple[dict[str, object], list[int]]:
    """The next message on `sock` and the (at most `fds`) descriptors sent with it, which
    the caller owns; raises WarmUnavailable (having closed them) for anything else."""
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
        raise WarmUnavailable(f"no answer from the warm process within {timeout:g} s")
    try:
        data, received, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, fds)
    except OSError as exc:
        raise WarmUnavailable(f"the warm process is gone: {exc}") from exc
    try:
        if not data:
            raise WarmUnavailable("the warm process ended")
        if flags & socket.MSG_CTRUNC:
            raise WarmUnavailable("the warm process sent more than floom asked for")
        message = _message(data, "the warm process")
    except WarmUnavailable:
        _close_all(received)
        raise
    return message, received


def _end(proc: subprocess.Popen[bytes], control: socket.socket) -> None:
    control.close()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _tail(proc: subprocess.Popen[bytes]) -> str:
    """Up to 4 KiB of what `proc` has written to its stderr so far, without waiting: it may
    still run (slow to start, or stalled), its stderr open, and a blocking read would then
    wait until it wrote 4 KiB or ended, holding up the thread that gives up on it."""
    if proc.stderr is None or proc.stderr.closed:
        return ""
    with contextlib.suppress(OSError, ValueError):
        fd = proc.stderr.fileno()
        os.set_blocking(fd, False)
        return os.read(fd, 4096).decode("utf-8", "replace")
    return ""  # nothing written (BlockingIOError), or the pipe is gone


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        _close_quietly(fd)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


_loaded: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _loaded
    if _loaded is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _loaded = libc
    return _loaded


def _message(data: bytes, sender: str) -> dict[str, Any]:
    """The JSON object `sender` sent; WarmUnavailable for anything else, or for an error it
    sent."""
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise WarmUnavailable(f"{sender} sent no message") from exc
    if not isinstance(message, dict):
        raise WarmUnavailable(f"{sender} sent no message")
    if "error" in message:
        raise WarmUnavailable(str(message["error"]))
    return message
