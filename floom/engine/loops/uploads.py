"""Object storage upkeep on nodes with the executor role, while new blobs go to an object
store (FLOOM_BLOB_STORE=s3): ended runs' logs left in run_events move into one blob each
(most runs' logs, and agent runs' records, are put into their objects as their ends are
recorded, services/ops/end_logs.py; not those that ended while the store was away or whose
lines changed meanwhile) as this node records their ends (those that end within GATHER_SECONDS
together), and at least every FLOOM_BLOB_SWEEP_SECONDS (runs ended elsewhere: a cancel, the
reaper; lines after an end); the store's pending uploads and deletes are done. While the
store is away the loop backs off; nothing waits for it but this thread.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from floom.errors import BlobStoreUnavailable, RowLocked
from floom.services.ops.objects import (
    LOG_BATCH,
    BlobProblem,
    archive_all_logs,
    archive_logs,
    drain_pending,
)

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.blobs")

# The first retry after the store was away, doubled at each failure up to the sweep interval.
FIRST_BACKOFF_SECONDS = 0.5
# How long the loop lets ended runs gather before it moves their logs, in one transaction of
# a few statements for all of them: each move's fixed cost to PostgreSQL (statements, their
# planning, a commit) was about as much again as its rows' when every run moved alone.
GATHER_SECONDS = 0.5


class ObjectUploads:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ended: set[str] = set()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.ctx.node.run_ends.watch_ends(self.run_ended)
        self._thread = threading.Thread(target=self._loop, name="floom-uploads", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_ended(self, run_id: str) -> None:
        """Called on the thread that recorded the end: note it, never wait."""
        with self._lock:
            self._ended.add(run_id)
        self._wake.set()

    def _loop(self) -> None:
        sweep = self.ctx.settings.blob_sweep_seconds
        backoff = 0.0
        swept = False
        while not self._stop.is_set():
            woken = self._wake.wait(backoff or sweep)
            self._wake.clear()
            if self._stop.is_set():
                return
            if woken and not backoff and self._stop.wait(GATHER_SECONDS):
                return
            with self._lock:
                ended, self._ended = self._ended, set()
            self._wake.clear()
            try:
                if ended and not backoff:
                    ordered = sorted(ended)
                    passed_over: dict[str, BlobProblem] = {}
                    for i in range(0, len(ordered), LOG_BATCH):
                        batch = ordered[i : i + LOG_BATCH]
                        archive_logs(
                            self.ctx, run_ids=batch, limit=len(batch), passed_over=passed_over
                        )
                if not woken or backoff or not swept:
                    self._sweep()
                    swept = True
                backoff = 0.0
            except BlobStoreUnavailable as exc:
                backoff = min(sweep, max(FIRST_BACKOFF_SECONDS, backoff * 2))
                log.warning("object store away, retrying in %.1fs: %s", backoff, exc.message)
            except RowLocked as exc:  # another node holds a row of this pass: not a bug
                log.warning("object store upkeep: %s; retrying at the next sweep", exc.message)
                backoff = sweep
            except Exception:  # the loop must outlive a bad pass (e.g. a lost database)
                log.exception("object store upkeep failed; retrying at the next sweep")
                backoff = sweep

    def _sweep(self) -> None:
        # A run whose earlier log is unreadable is passed over (said in the log) for this
        # sweep; the next tries it again, so a restored object is taken up.
        archive_all_logs(self.ctx, passed_over={}, stopping=self._stop.is_set)
        while not self._stop.is_set():
            report = drain_pending(self.ctx)
            if not report.uploaded and not report.deleted:
                return
