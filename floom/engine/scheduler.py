"""The scheduler: a thread that fires due schedule ticks (floom/services/schedules.py).

It sleeps until the next fire time (at most a second, so changed triggers are seen quickly
and an injected clock that runs fast is followed), which keeps fire-time skew in
milliseconds. With no schedule at all it sleeps until one is synced (wakeups.SCHEDULES).
The clock is injectable: tests call `tick(now)` directly instead of starting the thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from floom.services import wakeups
from floom.services.schedules import NextFireCache, fire_due

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.scheduler")

Clock = Callable[[], datetime]
MAX_SLEEP_SECONDS = 1.0


def system_clock() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    def __init__(self, ctx: Context, *, clock: Clock = system_clock) -> None:
        self.ctx = ctx
        self.clock = clock
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
            try:
                upcoming = self.tick()
            except Exception:  # the loop must outlive a bad tick (e.g. a lost database)
                log.exception("scheduler tick failed; retrying")
            if upcoming is None:
                # No schedule: nothing to do until one is synced (wakeups.SCHEDULES).
                delay = wakeups.IDLE_LOOK_SECONDS
            else:
                delay = min(MAX_SLEEP_SECONDS, max(0.0, (upcoming - self.clock()).total_seconds()))
            self._wake.wait(delay)
            self._wake.clear()
