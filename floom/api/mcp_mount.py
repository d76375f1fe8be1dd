"""Mounts the MCP endpoint at /mcp, loading the MCP SDK on the first request: the SDK costs
about 50 MB of memory, which a server nobody reaches over MCP should not pay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from floom.config import Settings

if TYPE_CHECKING:
    from floom.mcp.http import MCPEndpoint

PATH = "/mcp"


class LazyMCPMount:
    """`running()` belongs in the app's lifespan; it hosts the MCP session manager once the
    first request has started it, and stops it with the app."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._endpoint: MCPEndpoint | None = None
        self._guard: Any = None
        self._lock = anyio.Lock()
        self._tasks: anyio.abc.TaskGroup | None = None
        app.router.routes.append(Route(PATH, endpoint=self, include_in_schema=False))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    async def _start(self) -> Any:
        async with self._lock:
            if self._guard is not None:
                return self._guard
            if self._tasks is None:
                raise RuntimeError("the MCP endpoint is used outside the app's lifespan")
            # Imported on first use, not at the top: the MCP SDK costs ~50 MB of memory.
            from floom.mcp.http import MCPEndpoint, guard_for

            endpoint = MCPEndpoint(self.app, self.settings)
            started = anyio.Event()

            async def serve() -> None:
                async with endpoint.running():
                    started.set()
                    await anyio.sleep_forever()

            self._tasks.start_soon(serve)
            await started.wait()
            self._endpoint = endpoint
            self._guard = guard_for(endpoint)
            return self._guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = self._guard or await self._start()
        await guard(scope, receive, send)
