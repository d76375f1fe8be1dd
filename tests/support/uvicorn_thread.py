"""uvicorn servers that tests run in a thread and stop without uvicorn's idle waits.

uvicorn looks at `should_exit` every 0.1 s, then sleeps 0.1 s more before its shutdown for
the connections it asked to close, even when there is none. Tests stop a server after
closing their clients, so each stop waited about 0.17 s for nothing: a few minutes of the
suite, whose tests start a server or two each. This server looks every 0.01 s and skips the
sleep when no connection is open; everything else (connections that are open, background
tasks, the lifespan's shutdown) goes as uvicorn does it.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

TICKS_PER_UVICORN_TICK = 10  # uvicorn's tick of 0.1 s, looked at every 0.01 s


class QuickStopServer(uvicorn.Server):
    """A uvicorn.Server whose stop (`should_exit = True`) ends it in a few milliseconds."""

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            for _ in range(TICKS_PER_UVICORN_TICK):
                if self.should_exit:
                    return
                await asyncio.sleep(0.1 / TICKS_PER_UVICORN_TICK)

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
