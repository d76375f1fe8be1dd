"""Watching one bubblewrap sandbox from the host: its output as lines, its timeout, cancel
and limits, and the end of its whole process tree."""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Final

from floom.sandbox.base import LineSink, SandboxResult, SandboxUnavailable
from floom.sandbox.local import limits, procfs
from floom.sandbox.local.standby import ENTRY_NAME, LAUNCHER_NAME

# Well above the 16 KiB a stored line keeps: the run's log redacts secrets before it cuts,
# so a secret straddling its cut is still seen whole.
MAX_LINE_BYTES: Final = 64 * 1024
TRUNCATED_MARKER: Final = f" [line truncated at {MAX_LINE_BYTES} bytes]"
CANCEL_POLL_SECONDS: Final = 0.1
KILL_WAIT_SECONDS: Final = 5.0
REAP_WAIT_SECONDS: Final = 1.0
"""How long the end of a run waits for its pid 1, killed already, to exit, to reap it if it
was handed to floom (procfs.reap_if_ours)."""
# How the tools that start the sandbox prefix their own errors, which precede anything the
# command prints.
STARTUP_ERROR_PREFIXES: Final = (
    "bwrap: ",
    "setpriv: ",
    "unshare: ",
    "mount: ",
    "mkdir: ",
    f"{LAUNCHER_NAME}: ",
    f"{ENTRY_NAME}: ",
)


class Supervisor:
    """Streams one bwrap process's output and makes sure its whole tree ends.

    bwrap reports the host pid of the sandbox's pid 1 on the info fd; it is held as a pidfd.
    Killing pid 1 makes the kernel kill every process in the namespace, and pid 1 only
    becomes a zombie once they are all gone, so a readable pidfd means the tree has ended.
    """

    def __init__(self, proc: subprocess.Popen[bytes], info_fd: int, on_line: LineSink) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.proc = proc
        self.info_fd = info_fd
        self.info = bytearray()
        self.init_pidfd: int | None = None
        self.stderr = LineSplitter("stderr", on_line)
        self.readers = {
            proc.stdout.fileno(): LineSplitter("stdout", on_line),
            proc.stderr.fileno(): self.stderr,
        }
        self.poller = select.poll()
        self.open_fds: set[int] = set()
        for fd in (*self.readers, info_fd):
            self.poller.register(fd, select.POLLIN)
            self.open_fds.add(fd)

    def supervise(
        self,
        *,
        deadline: float,
        should_cancel: Callable[[], bool],
        timeout_seconds: float,
        release_fd: int,
        before_command: Callable[[int], None],
        check_limits: Callable[[], str | None],
        command_released: Callable[[], None] = lambda: None,
    ) -> SandboxResult:
        """Release the command once `before_command` has run on the sandbox's pid 1, then
        call `command_released`; stream the output until the tree ends, ending it on a
        timeout, a cancel or a limit reached."""
        proc = self.proc
        outcome: str | None = None
        limit: str | None = None
        ended_with: int | None = None
        try:
            self._release_command(release_fd, before_command)
            command_released()
            bwrap_pidfd = self._watch_bwrap()
            watching = True
            drain_deadline = math.inf
            next_cancel_check = time.monotonic() + CANCEL_POLL_SECONDS
            next_limit_check = time.monotonic() + limits.POLL_SECONDS
            while self.open_fds:
                now = time.monotonic()
                if watching:
                    if now >= deadline:
                        outcome = "timed_out"
                    elif now >= next_cancel_check:
                        next_cancel_check = now + CANCEL_POLL_SECONDS
                        if should_cancel():
                            outcome = "cancelled"
                        elif now >= next_limit_check:
                            next_limit_check = now + limits.POLL_SECONDS
                            if limit := check_limits():
                                outcome = "limit"
                            elif (ended_with := self._ended_under_stopped_init()) is not None:
                                outcome = "ended"
                    if outcome is not None:
                        watching = False
                        if not self.kill_tree():
                            outcome = None  # it ended on its own just before
                        drain_deadline = time.monotonic() + KILL_WAIT_SECONDS
                if watching:
                    wait = min(next_cancel_check, deadline) - now
                elif now >= drain_deadline:
                    break  # something outside the namespace holds a pipe; stop reading
                else:
                    wait = drain_deadline - now
                for fd, _ in self.poller.poll(math.ceil(max(wait, 0.0) * 1000)):
                    if fd == bwrap_pidfd:
                        self._close(fd)
                        if watching:
                            watching = False
                            drain_deadline = time.monotonic() + KILL_WAIT_SECONDS
                    elif data := os.read(fd, 65536):
                        self._feed(fd, data)
                    else:
                        self._close(fd)
            self._await_init_exit()
            if outcome in (None, "ended"):
                # A limit hit just before the end (an OOM-killed child, a file written
                # past the disk limit) still decides the run.
                limit = check_limits()
        finally:
            self._end()
        return self._result(
            proc.wait(),
            outcome=outcome,
            limit=limit,
            ended_with=ended_with,
            timeout_seconds=timeout_seconds,
        )

    def _watch_bwrap(self) -> int:
        """A pidfd of the bwrap process, polled with the output: readable once bwrap ended."""
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except OSError as exc:
            raise SandboxUnavailable(
                f"cannot watch the sandbox process: {exc}",
                hint="the local sandbox needs Linux 5.3 or newer (pidfd_open)",
            ) from exc
        self.poller.register(pidfd, select.POLLIN)
        self.open_fds.add(pidfd)
        return pidfd

    def _result(
        self,
        returncode: int,
        *,
        outcome: str | None,
        limit: str | None,
        ended_with: int | None,
        timeout_seconds: float,
    ) -> SandboxResult:
        """How the sandbox ended, from bwrap's return code and what supervising it saw."""
        if outcome == "timed_out":
            return SandboxResult(
                exit_code=None, timed_out=True, error=f"timed out after {timeout_seconds:g} s"
            )
        if outcome == "cancelled":
            return SandboxResult(exit_code=None, cancelled=True, error="cancelled")
        exit_code = 128 - returncode if returncode < 0 else returncode
        if outcome == "ended" and ended_with is not None:
            exit_code = ended_with
        if limit is not None:
            return SandboxResult(
                exit_code=None if outcome == "limit" else exit_code, limit_exceeded=limit
            )
        first = self.stderr.first_line
        failed_to_start = (
            exit_code != 0 and first is not None and first.startswith(STARTUP_ERROR_PREFIXES)
        )
        return SandboxResult(exit_code=exit_code, error=first if failed_to_start else None)

    def abandon(self, release_fd: int) -> None:
        """End a sandbox whose command was never released: its tree is killed before the
        release fd closes (bwrap runs the command on end-of-file too)."""
        try:
            self.kill_tree()
        finally:
            os.close(release_fd)
            self._end()

    def _end(self) -> None:
        """Kill what is left of the tree and close every descriptor held for it."""
        if self.proc.poll() is None:
            self.kill_tree()
        for fd in self.open_fds - self.readers.keys():
            os.close(fd)
        self.open_fds.clear()
        if self.init_pidfd is not None:
            # bwrap has been reaped: a pid 1 handed to floom is its child by now.
            procfs.reap_if_ours(self.init_pidfd, REAP_WAIT_SECONDS)
            os.close(self.init_pidfd)
            self.init_pidfd = None
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            stream.close()

    def _ended_under_stopped_init(self) -> int | None:
        # Judge by the command itself when something holds pid 1 stopped: bwrap would
        # only report the end once pid 1 reaps it (floom/sandbox/local/procfs.py).
        init_pid = _child_pid(self.info)
        return None if init_pid is None else procfs.command_exit_under_stopped_init(init_pid)

    def _release_command(self, release_fd: int, before_command: Callable[[int], None]) -> None:
        """Run the before-command steps on the sandbox's pid 1, then let bwrap start the
        command; if a step fails, the sandbox is killed before the command could run."""
        try:
            child_pid = self._read_child_pid()
            if child_pid is not None:  # None: bwrap failed early; its error is on stderr
                before_command(child_pid)
        except BaseException:
            self.kill_tree()
            raise
        finally:
            os.close(release_fd)

    def _read_child_pid(self) -> int | None:
        # bwrap reports pid 1 right after creating the namespaces, before it blocks.
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while self.info_fd in self.open_fds and self.init_pidfd is None:
            wait = deadline - time.monotonic()
            ready, _, _ = select.select([self.info_fd], [], [], max(wait, 0.0))
            if not ready:
                raise SandboxUnavailable(
                    f"bubblewrap did not report its sandbox within {KILL_WAIT_SECONDS:g} s",
                    hint="the node may be overloaded; try again",
                )
            if data := os.read(self.info_fd, 4096):
                self.info += data
                self.init_pidfd = open_init_pidfd(self.info)
            else:
                self._close(self.info_fd)
        return _child_pid(self.info) if self.init_pidfd is not None else None

    def kill_tree(self) -> bool:
        """Kill the sandbox's pid 1 and wait for bwrap; False when it had already ended."""
        proc = self.proc
        if proc.poll() is not None:
            return False
        init_pidfd = self._wait_for_init()
        if init_pidfd is not None:
            try:
                signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
                proc.wait(KILL_WAIT_SECONDS)  # bwrap reaps pid 1, then exits
                return True
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        # No pid 1 reported, or bwrap did not exit: its --die-with-parent takes the
        # namespace down with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True

    def _await_init_exit(self) -> None:
        # bwrap exits as soon as the command does; pid 1 then kills what the command left
        # running (--die-with-parent) and ends after it. Wait for that, bounded.
        if self.init_pidfd is None:
            return
        for _ in range(2):
            ready, _, _ = select.select([self.init_pidfd], [], [], KILL_WAIT_SECONDS)
            if ready:
                return
            try:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except ProcessLookupError:
                return

    def _wait_for_init(self) -> int | None:
        # bwrap writes its info right after creating the namespaces; wait for it briefly.
        deadline = time.monotonic() + 1.0
        while self.info_fd in self.open_fds and self.init_pidfd is None:
            wait = max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([self.info_fd], [], [], wait)
            if not ready:
                break
            if data := os.read(self.info_fd, 4096):
                self.info += data
            else:
                self._close(self.info_fd)
        return self.init_pidfd

    def _feed(self, fd: int, data: bytes) -> None:
        reader = self.readers.get(fd)
        if reader is not None:
            reader.feed(data)
        else:
            self.info += data

    def _close(self, fd: int) -> None:
        self.poller.unregister(fd)
        self.open_fds.discard(fd)
        reader = self.readers.get(fd)
        if reader is not None:
            reader.flush()  # the stream itself is closed with the Popen's file objects
            return
        os.close(fd)
        if fd == self.info_fd and self.init_pidfd is None:
            self.init_pidfd = open_init_pidfd(self.info)


class LineSplitter:
    """Turns one stream's bytes into lines, capping each at MAX_LINE_BYTES.

    A sink that may refuse lines wholesale (a run's log over its rate budget, or full:
    engine/runlog.py) offers `drops(stream, lines, size) -> bool`: asked with the whole
    lines of each read, it says whether it drops them all (and counts them); they are then
    neither split, decoded nor handed over one by one, so a run that floods its output costs
    the host a read and a count per chunk, not work per line. The first line of a stream is
    always handed over (the supervisor reads start-up errors from it)."""

    __slots__ = ("dropping", "drops", "first_line", "pending", "sink", "stream")

    def __init__(self, stream: str, sink: LineSink) -> None:
        self.stream = stream
        self.sink = sink
        self.drops: Callable[[str, int, int], bool] | None = getattr(sink, "drops", None)
        self.pending = bytearray()
        self.dropping = False  # inside a line that was already emitted truncated
        self.first_line: str | None = None

    def feed(self, data: bytes) -> None:
        if self.drops is not None and self.first_line is not None:
            cut = data.rfind(b"\n") + 1
            # A line emitted truncated already ends at the first newline: not one more line.
            lines = data.count(b"\n", 0, cut) - self.dropping
            if cut and self.drops(self.stream, lines, len(self.pending) + cut):
                self.pending[:] = data[cut:]  # the start of the next line, kept
                self.dropping = False
                return
        pending = self.pending
        pending += data
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            if self.dropping:
                self.dropping = False
            else:
                self._emit(pending[start:end])
            start = end + 1
        del pending[:start]
        if not self.dropping and len(pending) > MAX_LINE_BYTES:
            self._emit(pending)
            self.dropping = True
        if self.dropping:
            pending.clear()

    def flush(self) -> None:
        if self.pending and not self.dropping:
            self._emit(self.pending)
        self.pending.clear()

    def _emit(self, raw: bytearray) -> None:
        if len(raw) > MAX_LINE_BYTES:
            text = raw[:MAX_LINE_BYTES].decode("utf-8", "replace") + TRUNCATED_MARKER
        else:
            text = raw.decode("utf-8", "replace").removesuffix("\r")
        if self.first_line is None:
            self.first_line = text
        self.sink(self.stream, text)


def open_init_pidfd(info: bytes | bytearray) -> int | None:
    pid = _child_pid(info)
    try:
        return None if pid is None else os.pidfd_open(pid)
    except OSError:
        return None  # it already ended


def _child_pid(info: bytes | bytearray) -> int | None:
    try:
        pid = json.loads(info)["child-pid"]
    except (ValueError, KeyError, TypeError):
        return None  # bwrap failed before creating the sandbox, or the report is partial
    return pid if isinstance(pid, int) else None
