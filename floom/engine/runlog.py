"""A run attempt's log lines between the sandbox and the store: redacted on arrival, capped,
buffered until the executor's flusher writes them."""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import select

from floom.services.logs import append_events
from floom.services.secrets import Redactor
from floom.store.db import session_scope
from floom.store.models import Run, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_LINE = 16 * 1024
LINE_CUT_MARKER = f" [line truncated at {MAX_LINE} characters]"
# How a sandbox marks a line it cut because it was too long to pass on whole.
_SANDBOX_CUT = re.compile(r" \[line truncated at \d+ bytes\]\Z")

LogLine = tuple[str, str, datetime | None]

log = logging.getLogger("floom.executor")


class RunLog:
    """Buffers a run's lines (redacted on arrival) until the flusher writes them."""

    def __init__(
        self,
        *,
        run_id: str,
        attempt: int,
        redactor: Redactor,
        max_lines: int,
        max_bytes: int,
        epoch: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        # The lease epoch the attempt was claimed with (its fencing token): lines are written
        # only while the run still has it. None: not checked.
        self.epoch = epoch
        self.fenced = False
        self._redactor = redactor
        self._pending: list[LogLine] = []
        self._pending_since = 0.0  # time.monotonic() of the oldest pending line
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._count = 0
        self._max = max_lines
        self._bytes = 0
        self._max_bytes = max_bytes
        self._full = False
        self.last_stderr = ""

    def redact_with(self, redactor: Redactor) -> None:
        """Known once the run's secrets are resolved; no line has arrived before that."""
        self._redactor = redactor

    def add(self, stream: str, line: str) -> None:
        line = self.clean(line)
        size = len(line.encode("utf-8", "replace")) + 1
        with self._lock:
            if self._full:
                return
            self._count += 1
            if self._count > self._max:
                self._stop(
                    f"log limit of {self._max} lines reached; dropping further lines "
                    "(FLOOM_MAX_LOG_LINES_PER_RUN)"
                )
                return
            if self._bytes + size > self._max_bytes:
                self._stop(
                    f"log limit of {self._max_bytes} bytes reached; dropping further lines "
                    "(FLOOM_MAX_LOG_BYTES_PER_RUN)"
                )
                return
            self._bytes += size
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append((stream, line, utcnow()))
            if stream == "stderr" and line.strip():
                self.last_stderr = line

    def clean(self, line: str) -> str:
        """The line as stored: secrets redacted first, then cut to MAX_LINE, and any start of
        a secret left at a cut masked (also at a cut the sandbox made)."""
        redactor = self._redactor
        marker = ""
        if cut := _SANDBOX_CUT.search(line):
            marker, line = cut.group(0), redactor.cut_tail(redactor.text(line[: cut.start()]))
        else:
            line = redactor.text(line)
        if len(line) > MAX_LINE:
            marker, line = LINE_CUT_MARKER, redactor.cut_tail(line[:MAX_LINE])
        return line + marker

    def _stop(self, message: str) -> None:
        self._full = True
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(("system", message, utcnow()))

    def _holds(self, s: Any) -> bool:
        """Whether the run still has this attempt's lease epoch; if not, the attempt is
        fenced (another node's reaper or claim took the run) and its lines are refused."""
        epoch = s.exec(select(Run.lease_epoch).where(Run.id == self.run_id)).first()
        if epoch == self.epoch:
            return True
        self.fenced = True
        log.warning(
            "run %s attempt %d is fenced (its lease epoch %s, the run's now %s): its late "
            "log lines were refused",
            self.run_id,
            self.attempt,
            self.epoch,
            epoch,
        )
        return False

    def drain(self) -> list[LogLine]:
        """Take every pending line, after any flush in progress has been written, so the
        caller can store them in the same transaction as the run's end."""
        with self._flush_lock, self._lock:
            batch, self._pending = self._pending, []
        return batch

    def flush(self, ctx: Context, *, waited: float = 0.0) -> None:
        """Write the pending lines; with `waited`, only once the oldest of them has waited
        that many seconds. The flusher passes its interval: the lines of a run that ends
        sooner are written with its end, in that one transaction, instead of in a write
        transaction of their own (most runs end within the interval), and a line of a
        longer run still reaches the store within two intervals."""
        # One flush at a time per run: the flusher thread and the run's own final flush
        # must not interleave, or lines could land after the run's closing event.
        with self._flush_lock:
            with self._lock:
                if waited and (
                    not self._pending or time.monotonic() - self._pending_since < waited
                ):
                    return
                batch, self._pending = self._pending, []
            if batch and self.fenced:
                return
            if batch:
                try:
                    with session_scope(ctx.engine, write=True) as s:
                        if self.epoch is not None and not self._holds(s):
                            return
                        append_events(s, run_id=self.run_id, attempt=self.attempt, lines=batch)
                except BaseException:
                    # Kept, in order, for the next flush: a database away for a few seconds
                    # must not cut lines out of the middle of a run's log.
                    with self._lock:
                        self._pending[:0] = batch
                        self._pending_since = 0.0  # overdue: the next pass writes them
                    raise
