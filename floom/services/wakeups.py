"""Wake-ups: what a node does at once when a change concerns it. Across nodes the signals
of floom/store/signals.py carry them (PostgreSQL only); within a process, background loops
that have nothing to do sleep on a `Wakeup` until a change commits."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from sqlalchemy import event
from sqlmodel import Session

from floom.store import signals
from floom.store.db import is_postgres

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.wakeups")

# A loop sleeping on a Wakeup still looks every this many seconds: a writer it cannot hear
# (another process on the same SQLite file, a PostgreSQL node with FLOOM_SIGNALS off) may
# have changed something. Under a minute, so a schedule created that way fires on time
# (services/triggers/schedules.py ON_TIME_SECONDS).
IDLE_LOOK_SECONDS = 30.0


class Wakeup:
    """One kind of change that background loops of this process sleep on.

    A loop subscribes an Event of its own and waits on it; `notify_on_commit` (called in
    the changing transaction) sets every subscribed Event once the transaction commits, and
    sends `channel` to the other nodes. Nothing is sent for a change that rolled back.
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._events: set[threading.Event] = set()

    def subscribe(self, wake: threading.Event) -> None:
        with self._lock:
            self._events.add(wake)

    def unsubscribe(self, wake: threading.Event) -> None:
        with self._lock:
            self._events.discard(wake)

    def notify(self) -> None:
        with self._lock:
            events = list(self._events)
        for wake in events:
            wake.set()

    def notify_on_commit(self, s: Session) -> None:
        signals.publish(s, self.channel)
        event.listen(s, "after_commit", self._after_commit, once=True)

    def _after_commit(self, _session: Session) -> None:
        self.notify()


# Schedule triggers were added or changed (the scheduler has a new fire time to find).
SCHEDULES = Wakeup(signals.SCHEDULES_CHANGED)
# A handoff job took a lease (the lease reaper has something to watch), or the workers that
# bridge handoff roles changed (the bridge has something to do).
HANDOFFS = Wakeup(signals.HANDOFFS_CHANGED)
WAKEUPS = (SCHEDULES, HANDOFFS)

# Cancels heard for runs of any node; past this many the set starts over (a cancel lost
# that way still reaches its run at the executor's next heartbeat).
MAX_REMOTE_CANCELS = 10_000


def start_listening(ctx: Context) -> signals.Listener | None:
    """Start this node's listener (None on SQLite: one process, which wakes itself; and
    when FLOOM_SIGNALS is off)."""
    if not is_postgres(ctx.engine) or not ctx.settings.signals:
        return None

    def on_signal(channel: str, payload: str) -> None:
        if channel == signals.RUN_QUEUED:
            ctx.run_queued.set()
        elif channel == signals.RUN_CANCEL:
            if len(ctx.local_cancels) >= MAX_REMOTE_CANCELS:
                ctx.local_cancels.clear()
            ctx.local_cancels.add(payload)
        elif channel == signals.KEY_REVOKED:
            ctx.auth_cache.forget(payload)
        for wakeup in WAKEUPS:
            if channel == wakeup.channel:
                wakeup.notify()

    def on_connect() -> None:
        # Whatever was signalled while away is lost: start from the database again. The key
        # cache is trusted once the first heartbeat on this connection comes back.
        ctx.auth_cache.clear(trusted=False)
        ctx.run_queued.set()
        for wakeup in WAKEUPS:
            wakeup.notify()

    def on_disconnect() -> None:
        ctx.auth_cache.clear(trusted=False)

    listener = signals.Listener(
        ctx.engine.url,
        on_signal=on_signal,
        on_connect=on_connect,
        on_disconnect=on_disconnect,
        on_heard=ctx.auth_cache.heard,
    )
    listener.start()
    return listener
