"""The alert loop on nodes with the api or scheduler role: every FLOOM_ALERT_POLL_SECONDS a
pass of the alert watch (floom/services/alerts/watch.py), then the deliveries that are due
(alerts, tests re-sent, run callbacks) are handed to senders beside it. Both are idempotent
across nodes: events count once by their keys, deliveries are sent under a lease. The loop
keeps the watch's Pace, so an idle pass is one statement (the watch's probe, which also says
whether a delivery is due)."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from floom.errors import RowLocked
from floom.services.alerts import deliveries, watch
from floom.vocabulary import DeliveryPurpose

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.store.models import Delivery

log = logging.getLogger("floom.alerts")

# Sends under way at once on a node, each to its own receiver.
SENDERS = 4


class Sends:
    """Deliveries sent beside the watch, never by it: at most SENDERS receivers at once, one
    send at a time to each, so a receiver that hangs (each send may take twice
    FLOOM_ALERT_TIMEOUT_SECONDS) holds one sender, not the watch nor the sends to the others.
    Run callbacks (whose URLs whoever starts a run chooses, as many as they like) take at
    most all senders but one: the alerts always have one. Each delivery's claim is still
    renewed just before its send (deliveries.send_claimed)."""

    def __init__(self, ctx: Context, *, senders: int = SENDERS) -> None:
        self.ctx = ctx
        self.senders = senders
        self._lock = threading.Lock()
        self._busy: dict[str, bool] = {}  # receivers being sent to: whether callbacks
        self._closed = False

    def dispatch(self) -> int:
        """Claim what is due for the receivers not being sent to, and start sending; how many
        were claimed. Returns at once: the sends go on in threads of their own."""
        with self._lock:
            free = self.senders - len(self._busy)
            if self._closed or free <= 0:
                return 0
            claimed = deliveries.claim_due(
                self.ctx, limit=free, besides=self._busy, callbacks=False
            )
            room = min(
                free - len({deliveries.receiver_of(d) for d in claimed}),
                self.senders - 1 - sum(self._busy.values()),
            )
            if room > 0:
                claimed += deliveries.claim_due(
                    self.ctx, limit=room, besides=self._busy, callbacks=True
                )
            batches: dict[str, list[Delivery]] = defaultdict(list)
            for delivery in claimed:
                batches[deliveries.receiver_of(delivery)].append(delivery)
            for receiver, batch in batches.items():
                self._busy[receiver] = batch[0].purpose == DeliveryPurpose.CALLBACK
                threading.Thread(
                    target=self._send,
                    args=(receiver, batch),
                    name="floom-alert-send",
                    daemon=True,
                ).start()
            return len(claimed)

    def _send(self, receiver: str, batch: list[Delivery]) -> None:
        try:
            deliveries.send_claimed(self.ctx, batch)
        except Exception:  # a sender must give its receiver back whatever happened
            log.exception("sending deliveries failed; they are tried again when due")
        finally:
            with self._lock:
                self._busy.pop(receiver, None)
        try:
            self.dispatch()  # what waited for this sender or this receiver
        except Exception:  # the next pass of the watch dispatches again
            log.exception("could not claim due deliveries; trying again at the next pass")

    def close(self) -> None:
        """Start no more sends (those under way end by their deadline)."""
        with self._lock:
            self._closed = True


class AlertLoop:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sends = Sends(ctx)
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
        self.sends.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        interval = self.ctx.settings.alert_poll_seconds
        pace = watch.Pace()
        while True:
            try:
                watch.watch(self.ctx, pace=pace)
                if pace.deliver and not self._stop.is_set():
                    self.sends.dispatch()
            except RowLocked as exc:  # another node holds a row of this pass: not a bug
                log.warning("alert pass: %s; retrying at the next interval", exc.message)
            except Exception:  # the loop must outlive a bad pass (e.g. a lost database)
                log.exception("alert pass failed; retrying at the next interval")
            if self._stop.wait(interval):
                return
