"""uvicorn servers that tests run in a thread and stop without uvicorn's idle waits.

uvicorn looks at `should_exit` every 0.1 s, then sleeps 0.1 s more before its shutdown for
the connections it asked to close, even when there is none. Tests stop a server after
closing their clients, so each stop waited about 0.17 s for nothing: a few minutes of the
suite, whose tests start a server or two each. This server wakes as soon as `should_exit` is
set (and no more often than uvicorn does otherwise: a thread that woke every few
milliseconds would take the GIL from the test's own thread as often) and skips the sleep
when no connection is open; everything else (connections that are open, background tasks,
the lifespan's shutdown) goes as uvicorn does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn


class QuickStopServer(uvicorn.Server):
    """A uvicorn.Server whose stop (`should_exit = True`) ends it in a few milliseconds."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_asked: asyncio.Event | None = None
        self._should_exit = False
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        loop, asked = self._loop, self._stop_asked
        if value and loop is not None and asked is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(asked.set)

    async def main_loop(self) -> None:
        self._stop_asked = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        # on_tick reads should_exit: a stop asked before the loop was known ends it here.
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_asked.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Closed first, so that no connection is accepted after the count below.
        for server in self.servers:
            server.close()
        if self.server_state.connections:
            await super().shutdown(sockets=sockets)
            return
        for sock in sockets or []:
            sock.close()
        await self._wait_tasks_to_complete()
        if not self.force_exit:
            await self.lifespan.shutdown()
