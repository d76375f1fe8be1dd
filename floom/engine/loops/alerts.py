"""The alert loop on nodes with the api or scheduler role: every FLOOM_ALERT_POLL_SECONDS a
pass of the alert watch (floom/services/alerts/watch.py), then the deliveries that are due
(alerts, tests re-sent, run callbacks). Both are idempotent across nodes: events count once
by their keys, deliveries are sent under a lease. The loop keeps the watch's Pace, so an
idle pass is one statement (the watch's probe, which also says whether a delivery is due)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from floom.services.alerts import deliveries, watch

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.alerts")


class AlertLoop:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            deliveries.release_own(self.ctx)
        except Exception:  # the loop still starts; the leases expire on their own
            log.exception("could not release this node's earlier delivery leases")
        self._thread = threading.Thread(target=self._loop, name="floom-alerts", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        interval = self.ctx.settings.alert_poll_seconds
        pace = watch.Pace()
        while True:
            try:
                watch.watch(self.ctx, pace=pace)
                while pace.deliver and not self._stop.is_set():
                    pace.deliver = deliveries.deliver_due(self.ctx) > 0
            except Exception:  # the loop must outlive a bad pass (e.g. a lost database)
                log.exception("alert pass failed; retrying at the next interval")
            if self._stop.wait(interval):
                return
