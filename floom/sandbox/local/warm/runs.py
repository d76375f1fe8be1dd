"""One run started from a warm process, seen from the host: set up ahead to just before its
script (limits, dirs, uid, the drop), then given its environment and supervised as a cold
run is: its output as lines, its timeout, cancel and limits, and the end of its whole tree.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from floom.sandbox.base import (
    LineSink,
    SandboxResult,
    SandboxSpec,
    StartedAhead,
    read_only_files,
)
from floom.sandbox.fence import node_fence
from floom.sandbox.local import limits, procfs
from floom.sandbox.local.disks import RunDisk
from floom.sandbox.local.identity import OVERLAY_SCRATCH_SUFFIX, SandboxIdentity, share_files
from floom.sandbox.local.standby import memory_file
from floom.sandbox.local.supervisor import CANCEL_POLL_SECONDS, KILL_WAIT_SECONDS, LineSplitter
from floom.sandbox.local.uid_pool import UidLease
from floom.sandbox.local.warm.process import PreparedChild, WarmUnavailable, open_detached

log = logging.getLogger("floom.sandbox")

ColdStart = Callable[[LineSink, Callable[[], bool]], SandboxResult]
"""Runs a run's spec cold, given where its lines go and whether to stop (LocalSandbox)."""
SANDBOX_OUTPUT_DIR: Final = "/output"
REPORTER_EXIT_SECONDS: Final = 1.0
"""How long a run's end waits for pid 1's reporter to exit on its own before it is killed."""
EXIT_BEGIN_SECONDS: Final = 0.002
"""How long a run whose output has ended is watched for its pid 1's exit to begin, before
its end is waited for from pid 1's pidfd (`_Supervision.exit_begun`): pid 1 ends its output
just before it exits, and a pid 1 that does not exit by then is waited for as before."""


class WarmRun(StartedAhead):
    """A run on a prepared child, set up to just before its script (`set_up`): exactly one of
    `run` and `discard` ends it."""

    def __init__(
        self,
        spec: SandboxSpec,
        child: PreparedChild,
        *,
        env: dict[str, str],
        lease: UidLease,
        identity: SandboxIdentity,
        disk: RunDisk | None,
        ended: Callable[[], None],
        cold: ColdStart,
        release_later: Callable[[Callable[[], object]], None],
    ) -> None:
        """`cold`: how this run starts cold instead, should its child fail it after
        `set_up` returned (the run then never fails for want of a warm process).
        `release_later`: has what the run held released once it ended, off the run's path
        where the backend can (LocalSandbox._release_later)."""
        self.spec = spec
        self._child = child
        self._env = env
        self._lease = lease
        self._identity = identity.with_uid(lease.uid)
        self._disk = disk
        self._ended = ended
        self._cold = cold
        self._release_later = release_later
        self._limits: limits.RunLimits | None = None
        self._lock = threading.Lock()
        self._done = False

    def set_up(self) -> None:
        """Limits on the child's cgroup, the run's dirs handed to its uid, and the child
        asked to mount them and drop; raises WarmUnavailable (the caller discards this run
        and starts it cold). The child works on while the caller goes on (a run started
        ahead commits its claim meanwhile): `run` waits for its answer before the script's
        environment goes to it."""
        spec, child = self.spec, self._child
        try:
            self._limits = limits.RunLimits(spec, child.cgroup, disk=self._disk)
            if spec.fence:
                node_fence().watch(spec.fence, self._fence_targets())
            self._identity.hand_over(spec.workdir, spec.output_dir)
            request: dict[str, object] = {
                "op": "setup",
                "uid": self._lease.uid,
                "memory_bytes": spec.memory_mb * 1024 * 1024,
            }
            if spec.read_only:
                request["read_only"] = read_only_files(spec)
            if self._disk is None:
                request["fsize_bytes"] = limits.spec_disk_bytes(spec)
            if limits.MEMORY not in self._limits.enforced:
                request["data_bytes"] = spec.memory_mb * 1024 * 1024
            fds = self._mounts(request)
            try:
                child.ask(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
        except (OSError, WarmUnavailable) as exc:
            self.discard()
            raise WarmUnavailable(f"cannot set the warm run up: {exc}") from exc
        except BaseException:
            self.discard()
            raise

    def _mounts(self, request: dict[str, object]) -> list[int]:
        """Detached mounts of the run's dirs, for its pid 1 to move into its namespace:
        the work and output dirs, or with the version's files the files and the run dir,
        whose work dir the overlay's upper layer is."""
        spec = self.spec
        opened: list[int] = []
        try:
            if spec.files is not None:
                share_files(spec.files)
                work = spec.workdir
                if work.parent != spec.output_dir.parent:
                    raise WarmUnavailable("a layered warm run keeps its dirs side by side")
                scratch = work.with_name(work.name + OVERLAY_SCRATCH_SUFFIX)
                scratch.mkdir(mode=0o700, exist_ok=True)
                # The overlay's own work dir, the run's as its upper dir is: the warm process
                # mounts it as root of its user namespace, which maps the run's uid and not
                # the host's root (the run never sees it: it is unmounted before its script).
                self._identity.hand_over(scratch)
                request["overlay"] = True
                request["work_name"] = work.name
                opened.append(open_detached(spec.files))
                opened.append(open_detached(work.parent))
            else:
                opened.append(open_detached(spec.workdir))
            opened.append(open_detached(spec.output_dir))
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        return opened

    def _fence_targets(self) -> list[str]:
        cgroup = self._child.cgroup
        assert cgroup is not None, "warm runs need a cgroup"
        return [f"cgroup:{path}" for path in dict.fromkeys(cgroup.dirs.values())]

    def _take(self) -> bool:
        with self._lock:
            taken, self._done = not self._done, True
        return taken

    def run(self, *, on_line: LineSink, should_cancel: Callable[[], bool]) -> SandboxResult:
        if not self._take():
            raise WarmUnavailable("this warm run was discarded before it ran")
        try:
            # Sent before the set-up's answer is read: pid 1 reads it only once it has
            # dropped its rights (a child that fails its set-up exits unread, and the run
            # starts cold), and starts the script without a round trip to floom between.
            given = json.dumps({"env": self._env, "argv": self.spec.command[1:]}).encode()
            source = memory_file(given)
            try:
                self._child.ask({"op": "start"}, [source])
            finally:
                os.close(source)
            self._child.answer()  # the run's dirs are mounted, its rights dropped
        except WarmUnavailable as exc:
            # Released before the run starts cold on the same dirs: the child's processes,
            # which had them mounted, are dead by then.
            self._end(now=True)
            log.warning("a warm run starts cold: cannot set the warm run up: %s", exc.message)
            return self._cold(on_line, should_cancel)
        try:
            result = _Supervision(self._child, on_line).supervise(
                deadline=time.monotonic() + self.spec.timeout_seconds,
                should_cancel=should_cancel,
                check_limits=self._limits.reached if self._limits else lambda: None,
            )
        finally:
            self._end()
        if result.timed_out:
            return replace(result, error=f"timed out after {self.spec.timeout_seconds:g} s")
        if result.limit_exceeded:
            return replace(result, error=limits.limit_message(result.limit_exceeded, self.spec))
        return result

    def discard(self) -> None:
        if self._take():
            self._end(now=True)

    def _end(self, *, now: bool = False) -> None:
        """Kill what is left; then, off the run's path unless `now`, remove the cgroup and
        give the uid back (unless a process of the run may be left)."""
        self._child.discard_processes()
        if self._limits is not None:
            self._limits.ended()
        if now:
            self._release()
        else:
            self._release_later(self._release)
        self._ended()

    def _release(self) -> None:
        """Once pid 1 has ended, only the process that reported its status may be left, on
        its way out: waited for, its cgroup can be removed at once, not after a kill and a
        retry."""
        child = self._child
        child.await_reporter(REPORTER_EXIT_SECONDS)
        child.close_fds()
        removed = self._limits.close() if self._limits is not None else True
        if self._limits is None and child.cgroup is not None:
            removed = child.cgroup.remove()
        child.cgroup = None
        if removed:
            self._lease.release()


class _Supervision:
    """Streams a warm run's output and makes sure its whole tree ends. Its pid 1 is the
    script itself: once it has ended, the kernel has ended every process of its namespace,
    and its parent reports its status on the child's socket.

    Where floom reads pid 1's status from its pidfd, the run ends as soon as nothing of it
    can run any more, not once the kernel has torn it down: pid 1 closes its output just
    before it exits (inside.py `_finish`), and once its output has ended and pid 1 has
    begun its exit, alone in the run's cgroup (procfs.exit_begun), its status is the run's.
    No code of the run runs from then on, and no system call of it is under way, so its
    output, work dir and output dir are what they will stay; the teardown of pid 1's
    address space and namespaces (1-3 ms, more for a worker that imports much) is left to
    the run's release, which removes its cgroup only once pid 1 has gone. A run that left
    any other process or thread is waited for as before, until pid 1's end has ended them
    all."""

    def __init__(self, child: PreparedChild, on_line: LineSink) -> None:
        self.child = child
        self.readers = {
            child.stdout: LineSplitter("stdout", on_line),
            child.stderr: LineSplitter("stderr", on_line),
        }
        self.begun_status: int | None = None
        """pid 1's wait status, read once its exit had begun (`exit_begun`)."""

    def _output_ended(
        self, fd: int, poller: select.poll, open_fds: set[int], *, watching: bool
    ) -> None:
        """`fd`, one of the run's outputs, is at its end: once both are, and pid 1's exit
        has begun (`begun_status`), pid 1's pidfd is not waited for."""
        poller.unregister(fd)
        open_fds.discard(fd)
        self.readers[fd].flush()
        init = self.child.init_pidfd
        if watching and open_fds == {init}:
            self.begun_status = self.exit_begun()
            if self.begun_status is not None:
                poller.unregister(init)
                open_fds.discard(init)

    def exit_begun(self) -> int | None:
        """pid 1's wait status once its exit has begun with nothing else of the run left,
        waiting for that up to EXIT_BEGIN_SECONDS; None when it did not come, or where a
        reporter (the older kernels' way) or no cgroup is there to tell."""
        child = self.child
        if child.reports or child.cgroup is None:
            return None
        tasks = child.cgroup.tasks
        deadline = time.monotonic() + EXIT_BEGIN_SECONDS
        pause = 0.0
        while True:
            status = procfs.exit_begun(child.init_pid, tasks)
            if select.select([child.init_pidfd], [], [], 0)[0]:
                return None  # it has ended already: its pidfd says how
            if status is not None:
                return status  # and pid 1 had not ended: its pid was no other's
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pause == 0.0:
                # Its output's end woke this thread, maybe on pid 1's own CPU.
                os.sched_yield()
                pause = 0.00005
            else:
                select.select([child.init_pidfd], [], [], min(left, pause))
                pause *= 2

    def supervise(
        self,
        *,
        deadline: float,
        should_cancel: Callable[[], bool],
        check_limits: Callable[[], str | None],
    ) -> SandboxResult:
        child = self.child
        poller = select.poll()
        open_fds = {*self.readers, child.init_pidfd}
        for fd in open_fds:
            poller.register(fd, select.POLLIN)
        outcome: str | None = None
        limit: str | None = None
        watching = True
        drain_deadline = math.inf
        next_check = time.monotonic() + CANCEL_POLL_SECONDS
        next_limit_check = time.monotonic() + limits.POLL_SECONDS
        while open_fds:
            now = time.monotonic()
            if watching:
                if now >= deadline:
                    outcome = "timed_out"
                elif now >= next_check:
                    next_check = now + CANCEL_POLL_SECONDS
                    if should_cancel():
                        outcome = "cancelled"
                    elif now >= next_limit_check:
                        next_limit_check = now + limits.POLL_SECONDS
                        if limit := check_limits():
                            outcome = "limit"
                if outcome is not None:
                    watching = False
                    self.kill()
                    drain_deadline = time.monotonic() + KILL_WAIT_SECONDS
            if watching:
                wait = min(next_check, deadline) - now
            elif now >= drain_deadline:
                break  # something outside the namespace holds a pipe; stop reading
            else:
                wait = drain_deadline - now
            for fd, _ in poller.poll(math.ceil(max(wait, 0.0) * 1000)):
                if fd == child.init_pidfd:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    if watching:
                        watching = False
                        drain_deadline = time.monotonic() + KILL_WAIT_SECONDS
                elif data := os.read(fd, 65536):
                    self.readers[fd].feed(data)
                else:
                    self._output_ended(fd, poller, open_fds, watching=watching)
        if outcome == "timed_out":
            return SandboxResult(exit_code=None, timed_out=True)
        if outcome == "cancelled":
            return SandboxResult(exit_code=None, cancelled=True, error="cancelled")
        exit_code = self._exit_code()
        if outcome is None:
            # A limit hit just before the end (an OOM-killed child, a full disk) still
            # decides the run.
            limit = check_limits()
        if limit is not None:
            return SandboxResult(
                exit_code=None if outcome == "limit" else exit_code, limit_exceeded=limit
            )
        return SandboxResult(exit_code=exit_code)

    def _exit_code(self) -> int:
        """pid 1's exit code from its pidfd, or as its parent reported it (128 + N for
        signal N); killed, as a shell would say, when that parent was killed before it
        could report."""
        killed = 128 + signal.SIGKILL
        if self.begun_status is not None:
            status: object = self.begun_status
        elif not self.child.reports:
            status = self.child.init_status(KILL_WAIT_SECONDS)
        else:
            try:
                message = self.child.answer(KILL_WAIT_SECONDS)
            except WarmUnavailable:
                return killed
            status = message.get("status")
        if not isinstance(status, int) or status < 0:
            return killed
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.child.init_pidfd, signal.SIGKILL)
