"""What the host's /proc tells about a sandbox when bubblewrap cannot: the end of its command
while the sandbox's pid 1 is held stopped; the pid behind a pidfd another namespace sent
(`pid_of`); and the reaping of a sandbox's pid 1 that was handed to floom (`reap_if_ours`).

bubblewrap learns that its command ended from the sandbox's pid 1, which reaps it. A pid 1
stopped from outside (SIGSTOP, a ptrace stop) never does, and the run would look alive
until its timeout. The ended command stays a zombie meanwhile, and its exit status is in
/proc, so the supervisor can judge the run by the command itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
from collections.abc import Callable
from typing import Final

# /proc/<pid>/stat fields after the command name, counted from field 3 (the state).
_STATE: Final = 0
_PPID: Final = 1
_FLAGS: Final = 6  # field 9: the kernel's PF_* flags
_VSIZE: Final = 20  # field 23: the address space's size, 0 once the task let go of it
_EXIT_CODE: Final = 49  # field 52: the status waitpid would report, since Linux 3.5


def command_exit_under_stopped_init(init_pid: int) -> int | None:
    """The exit code of the sandbox's command (pid 2 inside, the first child of `init_pid`)
    when `init_pid` is stopped and the command has ended; None otherwise. A command killed
    by signal N reads as 128 + N, as a shell reports it."""
    init = _stat(init_pid)
    if init is None or init[_STATE] not in ("T", "t"):
        return None
    command = _command_of(init_pid)
    if command is None:
        return None
    fields = _stat(command)
    if fields is None or fields[_STATE] != "Z" or len(fields) <= _EXIT_CODE:
        return None
    status = int(fields[_EXIT_CODE])
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def zombie_status(pid: int) -> int | None:
    """The wait status of process `pid` while it is a zombie (ended, not reaped yet: its pid
    cannot have been reused), else None."""
    fields = _stat(pid)
    if fields is None or fields[_STATE] != "Z" or len(fields) <= _EXIT_CODE:
        return None
    return int(fields[_EXIT_CODE])


_PF_EXITING: Final = 0x4
"""include/linux/sched.h: set as a task enters its exit, before anything of it is torn down."""


def exit_begun(init_pid: int, tasks: Callable[[], set[int] | None]) -> int | None:
    """The wait status of `init_pid` once it has begun its exit and let go of its address
    space, alone in its run (`tasks()`: the thread ids of the run's cgroup, read after
    that, hold no other); else None. From then on no code of the run runs and no system
    call of it is under way (a task in its exit never returns to user space), though the
    kernel may take milliseconds more to tear the address space and the namespaces down
    before a pidfd of `init_pid` says it ended. The kernel sets a task's exit status before
    it lets go of its address space (do_exit: exit_code, then exit_mm), so once the size
    reads 0 the status is the one waitpid will report. A run with any other task left (a
    thread, a child, even one being killed) is not ended here: its pid 1's end ends them
    all. The caller must check that `init_pid` had not ended when this returned (its pid
    could be another's then)."""
    init = _stat(init_pid)
    if init is None or not _exiting(init) or int(init[_VSIZE]) != 0:
        return None
    # Read after pid 1 had begun its exit (it forks nothing more): whatever it forked
    # before is in the cgroup, or has left it at its own exit.
    left = tasks()
    if left is None or not left <= {init_pid}:
        return None
    return int(init[_EXIT_CODE])


def _exiting(fields: list[str]) -> bool:
    return len(fields) > _EXIT_CODE and bool(int(fields[_FLAGS]) & _PF_EXITING)


def _command_of(init_pid: int) -> int | None:
    """The command among `init_pid`'s children: the earliest started (lowest pid inside the
    namespace). It is pid 2 unless something ran inside before it (a mount helper, when the
    sandbox's stage fell back to its launcher's script under load): those have ended and been
    reaped by then, and an orphan reparented to pid 1 comes later."""
    found: list[tuple[int, int]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or fields[_PPID] != str(init_pid):
            continue
        inside = _namespace_pid(int(entry))
        if inside is not None:
            found.append((inside, int(entry)))
    return min(found)[1] if found else None


def _namespace_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def reap_if_ours(pidfd: int, timeout: float) -> None:
    """Reap the process `pidfd` refers to once it has exited (waiting up to `timeout`
    seconds), if it has become floom's child; anything else is left alone. A sandbox's pid 1
    outlives its parent (bubblewrap exits as soon as the command does, and a warm run's
    reporter may outlive its warm process), so the kernel hands it to the nearest
    subreaper: floom itself when it is its PID namespace's pid 1 (a container without an
    init), where each run would otherwise leave a zombie for good, until the node could
    start no process. Reaped by its pidfd, never by a pid, nor any other child of floom's
    (whose status belongs to whoever started it)."""
    ready, _, _ = select.select([pidfd], [], [], timeout)
    if not ready:
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)


def pid_of(pidfd: int) -> int:
    """The pid, in floom's PID namespace, of the process behind `pidfd` (one a warm process
    sent: the pids it knows are those of its own namespace); raises OSError when `pidfd` is
    not a pidfd or its process has been reaped."""
    with open(f"/proc/self/fdinfo/{pidfd}") as info:
        for line in info:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
                raise OSError(errno.ESRCH, "the process has ended")
    raise OSError(errno.EBADF, "not a pidfd")
