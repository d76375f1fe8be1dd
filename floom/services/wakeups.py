"""Wake-ups: what a node does at once when a change concerns it. Across nodes the signals
of floom/store/signals.py carry them (PostgreSQL only); within a process, background loops
that have nothing to do sleep on a `Wakeup` until a change commits. The node's listener of
other nodes' signals is floom/engine/runtime.py's."""

from __future__ import annotations

import threading

from sqlalchemy import event
from sqlmodel import Session

from floom.store import signals

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
