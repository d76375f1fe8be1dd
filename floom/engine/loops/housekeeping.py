"""Housekeeping on nodes with the scheduler role: a thread that applies retention
(floom/services/ops/retention.py) every FLOOM_RETENTION_INTERVAL_SECONDS.

The scheduler role, not the executor: it is the role that does time-driven work, one or a
few nodes hold it, and a pass is idempotent, so two scheduler nodes pruning at once only
repeat each other's deletes.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from floom.errors import RowLocked
from floom.services.ops.retention import apply_retention

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.housekeeping")

# The first pass waits this long after start-up, so a starting node serves first.
FIRST_PASS_DELAY_SECONDS = 60.0


class Housekeeping:
    def __init__(self, ctx: Context, *, first_delay: float = FIRST_PASS_DELAY_SECONDS) -> None:
        self.ctx = ctx
        self.first_delay = first_delay
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="floom-housekeeping", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        delay = min(self.first_delay, self.ctx.settings.retention_interval_seconds)
        while not self._stop.wait(delay):
            delay = self.ctx.settings.retention_interval_seconds
            try:
                report = apply_retention(self.ctx)
            except RowLocked as exc:  # another node holds a row of this pass: not a bug
                log.warning("retention pass: %s; retrying at the next interval", exc.message)
                continue
            except Exception:  # the loop must outlive a bad pass (e.g. a lost database)
                log.exception("retention pass failed; retrying at the next interval")
                continue
            if any(report.to_dict().values()):
                log.info("retention: %s", report.to_dict())
