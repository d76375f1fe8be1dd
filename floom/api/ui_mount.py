"""Serves the web UI at /, loading it on the first request that no API route answers: jinja2,
the pages' modules and their routes cost a server about 5 MiB resident, which a node used
only through the API, MCP or the CLI (or idle) should not pay."""

from __future__ import annotations

from types import ModuleType

import anyio
from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import Receive, Scope, Send


class LazyUI:
    """Holds the last route of the app, matching any path and method, until the first
    request reaches it; then puts the UI's routes in its place and sends that request (and
    every later one) through the app's routes again, so they are matched exactly as if the
    UI had been there from the start (the UI's paths overlap no other route's)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._lock = anyio.Lock()
        self._route = Route("/{path:path}", endpoint=self, include_in_schema=False)
        app.router.routes.append(self._route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._lock:
            routes = self.app.router.routes
            if self._route in routes:
                ui = await anyio.to_thread.run_sync(_load_ui)
                routes.remove(self._route)
                ui.install(self.app)
        await self.app.router(scope, receive, send)


def _load_ui() -> ModuleType:
    # Imported on first use, not at the top: jinja2 and the pages' modules (about 5 MiB).
    from floom.ui import app as ui

    return ui
