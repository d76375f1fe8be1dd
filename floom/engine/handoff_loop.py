"""The handoff layer's background thread: returns jobs with expired leases to `published`
and, on executor nodes, drives the worker bridge (handoff triggers).

Every node may run one: reaping is a SKIP LOCKED sweep with checked moves, and the bridge's
claims are ordinary claims, so two nodes never take or return the same job twice.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from floom.services.handoffs import bridge as handoff_bridge
from floom.services.handoffs.flow import reap_expired_leases

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.handoffs")
MIN_BRIDGE_INTERVAL = 0.2


class HandoffLoop:
    def __init__(self, ctx: Context, *, bridge: bool) -> None:
        self.ctx = ctx
        self.bridge = bridge
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="floom-handoffs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        settings = self.ctx.settings
        bridge_every = max(settings.poll_interval_seconds, MIN_BRIDGE_INTERVAL)
        wait = bridge_every if self.bridge else settings.reap_interval_seconds
        next_reap = time.monotonic() + settings.reap_interval_seconds
        while not self._stop.wait(wait):
            try:
                if time.monotonic() >= next_reap:
                    next_reap = time.monotonic() + settings.reap_interval_seconds
                    count = reap_expired_leases(self.ctx)
                    if count:
                        log.info("returned %d handoff job(s) with expired leases", count)
                if self.bridge:
                    found = handoff_bridge.bridge_pass(self.ctx)
                    # No handoff trigger anywhere: look again only at the reaper's pace
                    # instead of waking every poll interval to find nothing to do.
                    wait = bridge_every if found.busy else settings.reap_interval_seconds
            except Exception:  # the loop must outlive a database hiccup; it tries again
                log.exception("handoff background work failed; retrying")
