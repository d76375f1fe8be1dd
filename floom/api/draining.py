"""While a node drains (it was told to stop and its running runs are ending), its API still
takes connections and answers every request 503 `node_draining` with Retry-After, so clients
and load balancers retry or go elsewhere instead of meeting a refused connection."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from floom.api.errors import floom_error_response
from floom.errors import NodeDraining


class Drain:
    """Whether the node drains, and until when (monotonic seconds) at the latest."""

    def __init__(self) -> None:
        self._until: float | None = None
        self._lock = threading.Lock()

    def begin(self, *, seconds: float, now: float) -> None:
        with self._lock:
            self._until = now + seconds

    def retry_after(self, *, now: float) -> int | None:
        """Seconds a client should wait before it retries; None when the node serves."""
        with self._lock:
            if self._until is None:
                return None
            return max(1, math.ceil(self._until - now))


class DrainingGuard:
    """The ASGI middleware answering 503 while `drain` says the node drains."""

    def __init__(self, app: Any, *, drain: Drain, clock: Any) -> None:
        self.app, self.drain, self.clock = app, drain, clock

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        wait = self.drain.retry_after(now=self.clock()) if scope["type"] == "http" else None
        if wait is None:
            await self.app(scope, receive, send)
            return
        refused = NodeDraining(
            "this floom node is shutting down: it lets its running runs end and takes no "
            "new requests",
            hint=f"retry in {wait} s, or send the request to another node of the cluster",
            details={"retry_after_seconds": wait},
        )
        response = floom_error_response(refused)
        response.headers["Retry-After"] = str(wait)
        await response(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM or SIGINT drains the node's executor while
    the API answers 503 (uvicorn alone would close its sockets first, then drain in the
    lifespan's end); once the drain is over, uvicorn stops as it would have. A second signal
    ends the drain at once: the running attempts are interrupted and requeued."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        app: FastAPI,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        """`on_started`: called once the app's lifespan has started and the server listens."""
        super().__init__(config)
        self.floom_app = app
        self._draining: threading.Thread | None = None
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        node = getattr(self.floom_app.state, "node", None)
        executor = getattr(node, "executor", None)
        if executor is None or (self.should_exit and self._draining is None):
            super().handle_exit(sig, frame)
            return
        if self._draining is not None:
            executor.interrupt_now()
            return
        drain: Drain = self.floom_app.state.drain
        drain.begin(seconds=executor.ctx.settings.drain_seconds, now=time.monotonic())
        self._draining = threading.Thread(
            target=self._drain_then_exit, args=(executor,), name="floom-drain", daemon=True
        )
        self._draining.start()

    def _drain_then_exit(self, executor: Any) -> None:
        try:
            executor.stop()
        finally:
            self.should_exit = True
