"""Wake-ups across nodes: what a node does at once when another node's change concerns it
(floom/store/signals.py carries the signals; PostgreSQL only)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from floom.store import signals
from floom.store.db import is_postgres

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.wakeups")

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

    def on_connect() -> None:
        # Whatever was signalled while away is lost: start from the database again.
        ctx.auth_cache.clear(trusted=True)
        ctx.run_queued.set()

    def on_disconnect() -> None:
        ctx.auth_cache.clear(trusted=False)

    listener = signals.Listener(
        ctx.engine.url, on_signal=on_signal, on_connect=on_connect, on_disconnect=on_disconnect
    )
    listener.start()
    return listener
