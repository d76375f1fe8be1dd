"""One command in an E2B sandbox: started in the background, its output read in a thread
and handed as lines to the calling thread, cancel and timeout polled while it runs."""

from __future__ import annotations

import contextlib
import logging
import queue
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, NotFoundException, TimeoutException
from e2b import Sandbox as E2BBox

from floom.sandbox.base import LineSink, SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.local.supervisor import LineSplitter

log = logging.getLogger("floom.sandbox.e2b")

HOME = "/home/user"
WORKDIR = "/home/user/work"
OUTPUT_DIR = "/home/user/output"
# After a cancel or timeout, how long the command's stream may take to end once killed.
KILL_GRACE_SECONDS = 1.5
POLL_SECONDS = 0.1
QUEUED_CHUNKS = 16
"""The most chunks of output read ahead of the run's log: beyond them the reader waits, and
E2B's stream with it (a chunk is at most the SDK's 4 MB message)."""
# Inert values the process gets besides its spec's environment (the template sets PATH, HOME).
INERT_ENV = {"LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class E2BCommand:
    """One command in a sandbox: its output read in a thread, lines handed to `on_line` in
    the calling thread, cancel and timeout polled while it runs."""

    def __init__(
        self, box: E2BBox, spec: SandboxSpec, on_line: LineSink, *, unpack: str = ""
    ) -> None:
        """`unpack`: a shell line the command runs first, in /home/user (unpacking the
        files just uploaded); the command then runs in the work dir as without it."""
        self.box = box
        self.spec = spec
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=QUEUED_CHUNKS)
        self.finished = threading.Event()  # the calling thread reads no more events
        self.splitters = {s: LineSplitter(s, on_line) for s in ("stdout", "stderr")}
        env = {**INERT_ENV, **spec.env, "FLOOM_OUTPUT_DIR": OUTPUT_DIR}
        line = shlex.join(spec.command)
        if unpack:
            line = f"{unpack}; cd {WORKDIR} && exec {line}"
        self.handle = box.commands.run(
            line,
            background=True,
            envs=env,
            cwd=HOME if unpack else WORKDIR,
            # A backstop: floom kills the command at its own deadline first.
            timeout=spec.timeout_seconds + 30,
            # Its output goes to the run's log as it comes (within the log's budget): kept
            # for the result too, a run printing gigabytes held them all in floom's memory.
            retain_output=False,
        )
        threading.Thread(target=self._read, name="floom-e2b-output", daemon=True).start()

    def _read(self) -> None:
        try:
            done = self.handle.wait(
                on_stdout=lambda chunk: self._put("stdout", chunk),
                on_stderr=lambda chunk: self._put("stderr", chunk),
            )
            self._put("exit", done.exit_code)
        except CommandExitException as exc:
            self._put("exit", exc.exit_code)
        except _Finished:
            pass
        except Exception as exc:  # handed to the calling thread, which decides
            with contextlib.suppress(_Finished):
                self._put("error", exc)

    def _put(self, kind: str, value: Any) -> None:
        # Waits while the calling thread is behind (so E2B's stream waits too); gives up,
        # ending the SDK's read, once the calling thread stopped reading.
        while not self.finished.is_set():
            try:
                self.events.put((kind, value), timeout=POLL_SECONDS)
                return
            except queue.Full:
                continue
        raise _Finished

    def wait(self, should_cancel: Callable[[], bool], deadline: float) -> SandboxResult:
        ended: str | None = None
        stop_at: float | None = None
        # Cancel, timeout and the kill's grace are looked at every POLL_SECONDS whatever
        # comes: a run printing more often than that (or an envd streaming after the kill)
        # otherwise ran on to E2B's own backstop.
        next_look = 0.0
        while True:
            try:
                kind, value = self.events.get(timeout=POLL_SECONDS)
            except queue.Empty:
                kind, value = "", None
            if kind in ("stdout", "stderr"):
                self.splitters[kind].feed(value.encode("utf-8"))
            if kind in ("exit", "error"):
                break
            now = time.monotonic()
            if now < next_look:
                continue
            next_look = now + POLL_SECONDS
            if stop_at is not None and now > stop_at:
                break
            if ended is None:
                if should_cancel():
                    ended = "cancelled"
                elif time.monotonic() >= deadline:
                    ended = "timed_out"
                if ended is not None:
                    stop_at = time.monotonic() + KILL_GRACE_SECONDS
                    self._kill()
        self.finished.set()
        for splitter in self.splitters.values():
            splitter.flush()
        if ended == "timed_out":
            return SandboxResult(
                exit_code=None,
                timed_out=True,
                error=f"timed out after {self.spec.timeout_seconds:g} s",
            )
        if ended == "cancelled":
            return SandboxResult(exit_code=None, cancelled=True, error="cancelled")
        if kind == "error":
            if isinstance(value, (NotFoundException, TimeoutException)):
                raise SandboxUnavailable(
                    f"the E2B sandbox {self.box.sandbox_id} ended or became unreachable while "
                    f"the command ran: {value}",
                    hint="it was killed from outside, its time ran out, or E2B failed; floom "
                    "retries the run",
                ) from value
            raise value
        return SandboxResult(exit_code=int(value))

    def _kill(self) -> None:
        # In a thread: a kill that hangs on an unreachable E2B must not hold the run.
        def kill() -> None:
            try:
                self.handle.kill()
            except Exception as exc:  # the sandbox goes anyway when the session closes
                log.debug("killing an E2B command failed: %s", exc)

        threading.Thread(target=kill, name="floom-e2b-kill", daemon=True).start()


class _Finished(Exception):
    """Raised in the reader thread when the calling thread reads no more of its events."""
