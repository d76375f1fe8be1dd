"""A run attempt's log lines between the sandbox and the store: redacted on arrival, capped
in total and in rate, buffered until the executor's flusher writes them."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import select

from floom.services.access.secrets import Redactor
from floom.services.ops.end_logs import KeptLog
from floom.services.runs.logs import append_events
from floom.store.agents import ToolCall
from floom.store.db import session_scope
from floom.store.models import Run, RunEvent, trusted_row, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_LINE = 16 * 1024
LINE_CUT_MARKER = f" [line truncated at {MAX_LINE} characters]"
# How a sandbox marks a line it cut because it was too long to pass on whole.
_SANDBOX_CUT = re.compile(r" \[line truncated at \d+ bytes\]\Z")

LogLine = tuple[str, str, datetime | None]

log = logging.getLogger("floom.executor")


# The copy of a run's stored lines and tool calls an attempt keeps for its end (RunLog.kept)
# holds this many characters of their text at most; past it, the end reads them back.
KEPT_CHARS = 256 * 1024

# A run's log budget holds this many seconds of its rate, so a burst (an install's output)
# passes whole and only a sustained flood is cut.
BUDGET_BURST_SECONDS = 10.0
# Lines dropped over the budget are told in one log line per this many seconds of dropping
# (and at the run's end), however fast the run writes.
DROP_NOTE_SECONDS = 5.0


class LogBudget:
    """A token bucket of lines and bytes a second for one attempt's log: `take` says whether
    a line fits, and counts what did not until `dropped_note` tells it (a rate of 0: no
    limit on that count). Not thread-safe: RunLog calls it under its lock."""

    def __init__(
        self,
        *,
        lines_per_second: float,
        bytes_per_second: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines_per_second = lines_per_second
        self.bytes_per_second = bytes_per_second
        self._clock = clock
        self._lines = lines_per_second * BUDGET_BURST_SECONDS
        self._bytes = bytes_per_second * BUDGET_BURST_SECONDS
        self._at = clock()
        self.dropped = 0
        self._first_dropped_at = 0.0

    def take(self, size: int) -> bool:
        """Whether one line of `size` bytes fits (and is charged), else it is counted as
        dropped."""
        now = self._clock()
        self._refill(now)
        lines_rate, bytes_rate = self.lines_per_second, self.bytes_per_second
        if (lines_rate > 0 and self._lines < 1) or (bytes_rate > 0 and self._bytes < size):
            if not self.dropped:
                self._first_dropped_at = now
            self.dropped += 1
            return False
        self._lines -= 1
        self._bytes -= size
        return True

    def admit(self, lines: int, size: int) -> bool:
        """Whether `lines` whole lines of `size` bytes in all are kept, all of them (and
        charged at once), or dropped, all of them (and counted): kept only if the budget has
        room for them all (for more than it can ever hold, when it is full)."""
        self._refill(self._clock())
        lines_rate, bytes_rate = self.lines_per_second, self.bytes_per_second
        if (lines_rate <= 0 or self._lines >= min(lines, lines_rate * BUDGET_BURST_SECONDS)) and (
            bytes_rate <= 0 or self._bytes >= min(size, bytes_rate * BUDGET_BURST_SECONDS)
        ):
            self._lines -= lines
            self._bytes -= size
            return True
        if not self.dropped:
            self._first_dropped_at = self._at
        self.dropped += lines
        return False

    def _refill(self, now: float) -> None:
        passed, self._at = now - self._at, now
        lines_rate, bytes_rate = self.lines_per_second, self.bytes_per_second
        if lines_rate > 0:
            self._lines = min(lines_rate * BUDGET_BURST_SECONDS, self._lines + passed * lines_rate)
        if bytes_rate > 0:
            self._bytes = min(bytes_rate * BUDGET_BURST_SECONDS, self._bytes + passed * bytes_rate)

    def dropped_note(self, *, final: bool = False) -> str | None:
        """The one line that tells the lines dropped since the last note, once they have
        been dropped for DROP_NOTE_SECONDS (or, `final`, at once), else None."""
        if not self.dropped:
            return None
        if not final and self._clock() - self._first_dropped_at < DROP_NOTE_SECONDS:
            return None
        dropped, self.dropped = self.dropped, 0
        return (
            f"dropped {dropped} line{'s' if dropped != 1 else ''}: this run wrote faster than "
            f"its log budget of {self.lines_per_second:g} lines and "
            f"{self.bytes_per_second:g} bytes a second (FLOOM_LOG_LINES_PER_SECOND, "
            "FLOOM_LOG_BYTES_PER_SECOND)"
        )


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
        budget: LogBudget | None = None,
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
        self._budget = budget
        self._charged = 0  # lines of reads charged whole by `drops`, not yet added
        self.last_stderr = ""
        # A copy of the run's lines in run_events, in seq order (under _flush_lock), and of
        # its tool calls: None when not known whole (see `kept`).
        self._kept: list[RunEvent] | None = None
        self._kept_calls: list[ToolCall] = []
        self._kept_chars = 0

    def keep_stored(self, lines: Sequence[RunEvent]) -> None:
        """Start the copy of the run's stored lines (`kept`) from `lines`: all it holds,
        seqs from 1 (written in its queueing transaction, which claimed it here)."""
        with self._flush_lock:
            self._kept = []
            self._kept_calls = []
            self._kept_chars = 0
            self._keep(list(lines))

    def keep_call(self, call: ToolCall | None) -> None:
        """Add a tool call the attempt stored (None: it was not stored) to the copy."""
        with self._flush_lock:
            if call is None:
                self._kept = None
            elif self._kept is not None:
                self._kept_calls.append(trusted_row(ToolCall, call.model_dump()))
                self._count_kept(
                    len(call.arguments_json) + len(call.result or "") + len(call.error or "")
                )

    def kept(self) -> KeptLog | None:
        """The run's lines in run_events and its tool calls as this attempt stored them,
        for its end to upload without reading them back (services/ops/end_logs.py); None
        unless the copy was started (`keep_stored`), every write of this attempt's lines
        since is known to have committed, and it stays under KEPT_CHARS. A line another
        writer stored is not in it: the end's count of the lines it deletes refuses it."""
        with self._flush_lock:
            if self._kept is None:
                return None
            return KeptLog(events=list(self._kept), calls=list(self._kept_calls))

    def _keep(self, lines: Sequence[RunEvent]) -> None:
        """Under _flush_lock: add `lines`, committed, to the copy."""
        if self._kept is None:
            return
        self._kept.extend(lines)
        self._count_kept(sum(len(e.line) for e in lines))

    def _count_kept(self, chars: int) -> None:
        self._kept_chars += chars
        if self._kept_chars > KEPT_CHARS:
            self._kept, self._kept_calls = None, []

    def _keep_batch(self, batch: Sequence[LogLine]) -> None:
        """Under _flush_lock: the lines of a flush that committed, numbered after the copy's
        last (as append_events numbers them, unless another writer's line came between: the
        count at the end tells)."""
        kept = self._kept
        if kept is None:
            return
        if any(ts is None for _, _, ts in batch):
            self._kept = None  # stamped by append_events itself: not known here
            return
        last = kept[-1].seq if kept else 0
        self._keep(
            [
                trusted_row(
                    RunEvent,
                    {
                        "run_id": self.run_id,
                        "seq": last + n,
                        "attempt": self.attempt,
                        "ts": ts,
                        "stream": stream,
                        "line": line,
                    },
                )
                for n, (stream, line, ts) in enumerate(batch, 1)
            ]
        )

    def redact_with(self, redactor: Redactor) -> None:
        """Known once the run's secrets are resolved; no line has arrived before that."""
        self._redactor = redactor

    def drops(self, stream: str, lines: int, size: int) -> bool:
        """For a reader of raw output (sandbox/supervisor.LineSplitter), before it splits a
        read: whether its `lines` whole lines of `stream`, `size` bytes in all, are dropped
        unread, because the log is full or its budget has no room for them all now (they are
        then counted as dropped). Lines let through are charged here, once for the read, so
        `add` does not charge them again one by one."""
        with self._lock:
            if self._full:
                return True  # the line that stopped the log said that the rest is dropped
            if self._budget is None or stream == "system":
                return False
            if not self._budget.admit(lines, size):
                return True
            self._charged += lines
            self._note_dropped()  # the window of drops before these lines ends here
            return False

    def add(self, stream: str, line: str) -> None:
        budget = self._budget
        with self._lock:
            # Before the redaction, which costs the most here: a line that will not be kept
            # costs the host as little as can be (floom's own lines are not the run's).
            if self._full:
                return
            if budget is not None and stream != "system":
                if self._charged:
                    self._charged -= 1  # its reader's read was charged whole (`drops`)
                elif not budget.take(len(line.encode("utf-8", "replace")) + 1):
                    return
                elif budget.dropped:
                    self._note_dropped()  # the window of drops before this line ends here
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
            self._append(stream, line)
            if stream == "stderr" and line.strip():
                self.last_stderr = line

    def _append(self, stream: str, line: str) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append((stream, line, utcnow()))

    def _note_dropped(self, *, final: bool = False) -> None:
        """Under the lock: one line for the lines the budget dropped since the last note,
        once per DROP_NOTE_SECONDS of dropping and at the end (`final`)."""
        if self._budget is not None and (note := self._budget.dropped_note(final=final)):
            self._append("system", note)

    __call__ = add  # a RunLog is its run's line sink, whose `drops` the reader asks first

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
        self._note_dropped(final=True)
        self._full = True
        self._append("system", message)

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
            self._note_dropped(final=True)
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
                self._note_dropped()
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
                    # Whether they were stored is not known (a commit lost on its way back):
                    # the end reads the lines back.
                    self._kept = None
                    # Kept, in order, for the next flush: a database away for a few seconds
                    # must not cut lines out of the middle of a run's log.
                    with self._lock:
                        self._pending[:0] = batch
                        self._pending_since = 0.0  # overdue: the next pass writes them
                    raise
                self._keep_batch(batch)
