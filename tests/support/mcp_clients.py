"""Helpers for the MCP tests: the SDK's own client over stdio (`floom mcp`) and HTTP (`/mcp`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests.support.harness import LiveServer

# Every MCP exchange in the tests is bounded by this (seconds).
CALL_TIMEOUT = 60.0
# The tool names are a contract with every agent configured to use floom.
FLOOM_TOOLS = frozenset(
    {
        "list_workers",
        "get_worker",
        "validate_worker",
        "deploy_worker",
        "run_worker",
        "list_runs",
        "get_run",
        "get_run_logs",
        "get_artifact",
        "watch_run",
        "cancel_run",
        "replay_run",
        "list_versions",
        "rollback_worker",
        "list_approvals",
        "decide_approval",
        "list_triggers",
        "pause_worker",
        "resume_worker",
        "list_secrets",
        "set_secret",
        "delete_secret",
    }
)


def stdio_params(env: dict[str, str], *args: str) -> StdioServerParameters:
    """`floom mcp` (with `args`, e.g. --key-file PATH) as a coding agent starts it."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "floom.cli", "mcp", *args], env=env
    )


@asynccontextmanager
async def stdio_client(server: LiveServer, key: str | None = None) -> AsyncIterator[Client]:
    async with Client(stdio_params(server.cli_env(key)), read_timeout_seconds=CALL_TIMEOUT) as c:
        yield c


@asynccontextmanager
async def http_client(
    server: LiveServer, key: str | None = None, *, host: str | None = None, **options: Any
) -> AsyncIterator[Client]:
    """The SDK client on `/mcp` with a bearer key (and, to stand for a proxy, a Host header)."""
    token = server.admin_key if key is None else key
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host:
        headers["Host"] = host
    timeout = httpx2.Timeout(CALL_TIMEOUT, read=CALL_TIMEOUT * 5)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
        async with Client(transport, read_timeout_seconds=CALL_TIMEOUT, **options) as client:
            yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured content of a successful tool call; fails the test on a tool error."""
    result = await call_raw(client, tool, **arguments)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


async def call_error(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The floom error ({"code", "message", "hint"}) of a tool call that must fail."""
    result = await call_raw(client, tool, **arguments)
    assert result.is_error, f"{tool} should have failed: {text_of(result)}"
    assert result.structured_content is not None, text_of(result)
    error: dict[str, Any] = result.structured_content["error"]
    assert "Traceback" not in text_of(result)
    return error


async def call_raw(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    with anyio.fail_after(CALL_TIMEOUT):
        return await client.call_tool(tool, arguments)


def worker_files(folder: Path) -> dict[str, str]:
    """A worker folder as the `files` argument of deploy_worker over HTTP."""
    return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}


def text_of(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)
