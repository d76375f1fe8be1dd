"""A real MCP server (the mcp SDK's MCPServer) over Streamable HTTP on loopback, with a bearer
token check in front: an issue tracker with list, create and delete tools."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

from tests.support.harness import free_port
from tests.support.uvicorn_thread import QuickStopServer


@contextmanager
def tracker_server(token: str) -> Iterator[dict[str, Any]]:
    """Yields {"url", "calls": [(tool, args)], "auth": [Authorization headers seen]}."""
    state: dict[str, Any] = {"calls": [], "auth": []}
    server = MCPServer("tracker")

    @server.tool()
    def list_issues(state_filter: str = "open") -> str:
        """List the tracker's issues."""
        state["calls"].append(("list_issues", {"state_filter": state_filter}))
        return "#1 Login fails (open)\n#2 Typo in footer (open)"

    @server.tool()
    def create_issue(title: str) -> str:
        """Create an issue."""
        state["calls"].append(("create_issue", {"title": title}))
        return "created #3"

    @server.tool()
    def delete_issue(number: int) -> str:
        """Delete an issue."""
        state["calls"].append(("delete_issue", {"number": number}))
        return "deleted"

    inner = server.streamable_http_app()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode()
            state["auth"].append(auth)
            if auth != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await inner(scope, receive, send)

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    uv = QuickStopServer(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the MCP stand-in did not start")
        time.sleep(0.02)
    state["url"] = f"http://127.0.0.1:{port}/mcp"
    try:
        yield state
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
