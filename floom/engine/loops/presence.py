"""This node's presence in the store: registers at start, renews its row every heartbeat,
and says in the log when the database stops answering and when it answers again. Its loop,
the one every node runs, also hands the C heap's free pages back to the system every
RELEASE_SECONDS (engine/loops/heap.py), off any request's path."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from floom.engine.loops.heap import release_free_memory
from floom.schemas.nodes import warm_row
from floom.services.ops import nodes

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.node")

# How often freed heap memory goes back to the system: a release costs a few ms of this
# thread's time; memory freed since the last one stays resident until the next.
RELEASE_SECONDS = 30.0


class NodePresence:
    def __init__(
        self,
        ctx: Context,
        *,
        slots: int | None,
        in_use: Callable[[], int],
        warm: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        self.ctx = ctx
        self.slots = slots
        self.in_use = in_use
        # This node's warm pools (Executor.warm_stats), kept in its row at each heartbeat so
        # that any node can list every node's pools.
        self.warm = warm
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registered = False
        # The database's last failure seen by a heartbeat, None while it answers.
        self.store_error: str | None = None

    def start(self) -> None:
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="floom-presence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            nodes.mark_stopped(self.ctx)
        except Exception:  # a node stopping while its database is away is shown as lost
            log.warning("could not record this node's stop in the database")

    def _loop(self) -> None:
        released = time.monotonic()
        while not self._stop.wait(self.ctx.settings.heartbeat_seconds):
            self._beat()
            if time.monotonic() - released >= RELEASE_SECONDS:
                release_free_memory()
                released = time.monotonic()

    def _warm(self) -> str | None:
        try:
            return warm_row(self.warm())
        except Exception:  # the pools' figures are shown, never worth a missed heartbeat
            log.exception("could not read this node's warm pools for its heartbeat")
            return None

    def _beat(self) -> None:
        try:
            if self._registered:
                nodes.heartbeat(self.ctx, slots_in_use=self.in_use(), warm=self._warm())
            else:
                nodes.register(self.ctx, slots=self.slots)
                self._registered = True
        except Exception as exc:  # the database may be away; the next heartbeat retries
            if self.store_error is None:
                log.error("database unreachable from node %s: %s", self.ctx.node_id, exc)
            self.store_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            return
        if self.store_error is not None:
            log.warning("database reachable again from node %s", self.ctx.node_id)
            self.store_error = None
