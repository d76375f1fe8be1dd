"""The scheduler: a thread that fires due schedule ticks (floom/services/triggers/schedules.py).

It sleeps until the next fire time, which keeps fire-time skew in milliseconds, or until
schedules are synced (wakeups.SCHEDULES): with no schedule at all it has nothing to do
until then (it looks again every wakeups.IDLE_LOOK_SECONDS for writers it cannot hear).
Its clock is the database's (floom/store/db.py, DatabaseClock.earliest), so schedulers
on nodes whose own clocks disagree fire each tick when it comes, neither early nor late.
An injected clock, which may run fast, is read at least every second.
The clock is injectable: tests call `tick(now)` directly instead of starting the thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from floom.errors import StoreUnavailable
from floom.services import wakeups
from floom.services.triggers.schedules import NextFireCache, fire_due
from floom.store.db import database_clock

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.scheduler")

Clock = Callable[[], datetime]
MAX_SLEEP_SECONDS = 1.0


class Scheduler:
    def __init__(self, ctx: Context, *, clock: Clock | None = None) -> None:
        self.ctx = ctx
        # Never later than the database's time: a tick is not fired before it comes.
        self.clock: Clock = clock or database_clock(ctx.engine).earliest
        self._clock_keeps_time = clock is None
        self._cache = NextFireCache()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, now: datetime | None = None) -> datetime | None:
        """Handle every tick due at `now` (default: the clock); returns the next fire time."""
        return fire_due(self.ctx, now=now or self.clock(), cache=self._cache)

    def start(self) -> None:
        wakeups.SCHEDULES.subscribe(self._wake)
        self._thread = threading.Thread(target=self._loop, name="floom-scheduler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the triggers again now (after a change of the clock or of the triggers)."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        wakeups.SCHEDULES.unsubscribe(self._wake)

    def _loop(self) -> None:
        while not self._stop.is_set():
            upcoming = None
            delay = wakeups.IDLE_LOOK_SECONDS  # no schedule: until one is synced
            try:
                upcoming = self.tick()
            except StoreUnavailable as exc:
                log.warning("scheduler: %s; retrying", exc.message)
                delay = MAX_SLEEP_SECONDS
            except Exception:  # the loop must outlive a bad tick
                log.exception("scheduler tick failed; retrying")
                delay = MAX_SLEEP_SECONDS
            if upcoming is not None:
                # The database's clock is slept on until the next fire (a synced change
                # wakes it earlier); an injected one may run fast, so it is read every second.
                longest = wakeups.IDLE_LOOK_SECONDS if self._clock_keeps_time else MAX_SLEEP_SECONDS
                delay = min(longest, max(0.0, (upcoming - self.clock()).total_seconds()))
            self._wake.wait(delay)
            self._wake.clear()
