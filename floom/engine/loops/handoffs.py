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

from floom.errors import RowLocked
from floom.services import wakeups
from floom.services.handoffs import bridge as handoff_bridge
from floom.services.handoffs import flow

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.handoffs")
MIN_BRIDGE_INTERVAL = 0.2


class HandoffLoop:
    """Reaps expired handoff leases at the reaper's pace while any job holds one, and (with
    `bridge`) runs bridge passes every poll interval while any worker bridges a role. With
    neither, it sleeps until a job takes a lease or the bridges change (wakeups.HANDOFFS),
    looking again every IDLE_LOOK_SECONDS for writers it cannot hear."""

    def __init__(self, ctx: Context, *, bridge: bool) -> None:
        self.ctx = ctx
        self.bridge = bridge
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        wakeups.HANDOFFS.subscribe(self._wake)
        self._thread = threading.Thread(target=self._loop, name="floom-handoffs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        wakeups.HANDOFFS.unsubscribe(self._wake)

    def _loop(self) -> None:
        settings = self.ctx.settings
        bridge_every = max(settings.poll_interval_seconds, MIN_BRIDGE_INTERVAL)
        next_reap = 0.0  # leases are looked at on start, then at the reaper's pace
        leased, bridging = True, self.bridge
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_reap:
                    next_reap = time.monotonic() + settings.reap_interval_seconds
                    leased = flow.any_lease_held(self.ctx)
                    count = flow.reap_expired_leases(self.ctx) if leased else 0
                    if count:
                        log.info("returned %d handoff job(s) with expired leases", count)
                if self.bridge:
                    bridging = handoff_bridge.bridge_pass(self.ctx).busy
            except RowLocked as exc:  # another node holds a row of this pass: not a bug
                log.warning("handoff background work: %s; retrying", exc.message)
                leased = True
            except Exception:  # the loop must outlive a database hiccup; it tries again
                log.exception("handoff background work failed; retrying")
                leased = True
            if bridging:
                wait = bridge_every
            elif leased:
                wait = max(0.0, next_reap - time.monotonic())
            else:
                wait = wakeups.IDLE_LOOK_SECONDS
            if self._wake.wait(wait):
                self._wake.clear()
                next_reap = 0.0  # a job took a lease, or the bridges changed: look now
                bridging = self.bridge
