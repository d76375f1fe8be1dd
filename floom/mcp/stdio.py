"""`floom mcp`: the MCP server over stdio, a thin client of a floom server's REST API."""

from __future__ import annotations

from typing import Any

from floom.client import FloomClient, configured_api_key
from floom.client_env import client_base_url
from floom.mcp.catalog import all_workers
from floom.mcp.rest_backend import RestBackend
from floom.mcp.server import FloomMCPServer

# Deploys made elsewhere reach the tool list this often (and on every list).
POLL_SECONDS = 10.0


def build_server(backend: RestBackend) -> FloomMCPServer:
    def load_workers() -> list[dict[str, Any]]:
        return all_workers(lambda cursor: backend.list_workers(cursor=cursor, limit=200))

    return FloomMCPServer(
        backend_for=lambda _ctx: backend, load_workers=load_workers, poll_seconds=POLL_SECONDS
    )


def serve() -> None:
    """Serve MCP on stdin/stdout until the client closes it. Configured by FLOOM_BASE_URL
    and FLOOM_API_KEY; without a key it still starts, and every call says how to set it up."""
    key = configured_api_key()
    client = FloomClient(client_base_url(), key, surface="mcp") if key else None
    backend = RestBackend(client)
    try:
        build_server(backend).run("stdio")
    finally:
        backend.close()
