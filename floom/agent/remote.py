"""Remote tool sources: MCP servers over Streamable HTTP (the mcp SDK's Client) and Composio,
each filtered by the worker's allowed_tools before the model sees anything. Every connection
goes through the egress guard (floom/net/egress.py), and a failure is told in floom's words,
never with what the other end answered."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from floom import jsonvalues
from floom.agent.tools import Tool, ToolError
from floom.cut import cut
from floom.errors import SourceUnavailable
from floom.manifest.agent import ToolSpec
from floom.net.egress import (
    RUNS,
    EgressPolicy,
    EgressRefused,
    describe_failure,
    guarded_async_client,
    guarded_client,
)

TOOL_NAME_CAP = 64
COMPOSIO_ERROR_CAP = 2000
# What floom reads of a remote source (an MCP server, Composio): each answer, and of its
# tools what goes to the model at every turn. A source is a third party's server; a larger
# answer or listing is refused or cut, never read whole.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_TOOLS_PER_SOURCE = 128
MAX_DESCRIPTION_CHARS = 4000
MAX_SCHEMA_BYTES = 64 * 1024


def _segment(text: str) -> str:
    """A tool slug as one path segment: a worker's allowed_tools (or a listed slug) cannot
    reach another path of the API floom calls with the operator's key."""
    return quote(text, safe="")


def _model_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:TOOL_NAME_CAP]


def _allowed(spec: ToolSpec, name: str) -> bool:
    allowed = spec.options.get("allowed_tools") or []
    return "*" in allowed or name in allowed


def _described(
    source: str, name: str, description: Any, schema: Any, note: Callable[[str], None]
) -> tuple[str, dict[str, Any]] | None:
    """A listed tool's description (cut) and input schema, or None (told) for a schema that
    is not a JSON object within floom's bounds and MAX_SCHEMA_BYTES."""
    if schema is None:
        schema = {"type": "object"}
    breach = jsonvalues.breach_of(schema, where="input schema", max_bytes=MAX_SCHEMA_BYTES)
    if not isinstance(schema, dict) or breach is not None:
        why = "is not a JSON object" if breach is None else "is over floom's bounds"
        note(f"{source}'s tool {name[:TOOL_NAME_CAP]!r} left out: its input schema {why}")
        return None
    return cut(str(description), MAX_DESCRIPTION_CHARS), schema


def _kept(source: str, tools: list[Tool], note: Callable[[str], None]) -> list[Tool]:
    if len(tools) > MAX_TOOLS_PER_SOURCE:
        note(
            f"{source} offers {len(tools)} allowed tools; the first {MAX_TOOLS_PER_SOURCE} "
            "are kept (name the ones wanted in allowed_tools)"
        )
    return tools[:MAX_TOOLS_PER_SOURCE]


# -- MCP --------------------------------------------------------------------------------------


def mcp_tools(
    spec: ToolSpec,
    *,
    token: str | None,
    timeout: float,
    note: Callable[[str], None],
    egress: EgressPolicy,
) -> list[Tool]:
    """The allowed tools of one MCP server. Each call opens its own session, so a paused run
    resumed in another process needs no state from this one."""
    url = str(spec.options["url"])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    server = _Server(url, headers, timeout, egress)

    try:
        listed = asyncio.run(_mcp_list(server))
    except Exception as exc:  # any transport or protocol failure means "unavailable"
        raise SourceUnavailable(
            f"MCP server '{spec.name}' cannot list its tools: {describe_failure(exc)}"
        ) from exc
    tools = []
    seen = set()
    source = f"MCP server '{spec.name}'"
    for item in listed:
        seen.add(item.name)
        if not _allowed(spec, item.name):
            continue
        described = _described(
            source,
            item.name,
            item.description or item.title or item.name,
            item.input_schema or None,
            note,
        )
        if described is None:
            continue
        tools.append(
            Tool(
                name=_model_name(f"{spec.name}__{item.name}"),
                description=described[0],
                input_schema=described[1],
                run=_mcp_caller(server, item.name),
                gated=spec.gated,
                source="mcp",
            )
        )
    for name in spec.options.get("allowed_tools") or []:
        if name != "*" and name not in seen:
            note(f"MCP server '{spec.name}' has no tool '{name}' (listed in allowed_tools)")
    return _kept(source, tools, note)


class _Server:
    """Where one MCP source is and how floom reaches it."""

    def __init__(
        self, url: str, headers: dict[str, str], timeout: float, egress: EgressPolicy
    ) -> None:
        self.url, self.headers, self.timeout, self.egress = url, headers, timeout, egress


async def _mcp_list(server: _Server) -> list[Any]:
    from mcp import Client

    tools: list[Any] = []
    async with (
        _mcp_client(server) as transport,
        Client(transport, read_timeout_seconds=server.timeout, cache=None) as client,
    ):
        cursor = None
        for _ in range(50):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
    return tools


class _mcp_client:  # used like a function in `async with`
    """The Streamable HTTP transport with floom's headers over the egress guard, closing its
    HTTP client after."""

    def __init__(self, server: _Server) -> None:
        self._server = server

    async def __aenter__(self) -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        server = self._server
        self._http = guarded_async_client(
            server.egress,
            places=RUNS,
            max_answer_bytes=MAX_ANSWER_BYTES,
            headers=server.headers,
            timeout=httpx2.Timeout(server.timeout),
        )
        await self._http.__aenter__()
        return streamable_http_client(server.url, http_client=self._http)

    async def __aexit__(self, *exc: object) -> None:
        await self._http.__aexit__(None, None, None)


def _mcp_caller(server: _Server, name: str) -> Callable[[dict[str, Any]], str]:
    def run(args: dict[str, Any]) -> str:
        try:
            result = asyncio.run(_mcp_call(server, name, args))
        except Exception as exc:  # the server's failure is the model's to read
            raise ToolError(f"MCP call {name} failed: {describe_failure(exc)}") from exc
        text = _mcp_text(result)
        if result.is_error:
            raise ToolError(text or f"MCP tool {name} reported an error")
        return text

    return run


async def _mcp_call(server: _Server, name: str, args: dict[str, Any]) -> Any:
    from mcp import Client

    async with (
        _mcp_client(server) as transport,
        Client(transport, read_timeout_seconds=server.timeout, cache=None) as client,
    ):
        return await client.call_tool(name, args)


def _mcp_text(result: Any) -> str:
    parts = []
    for item in result.content or []:
        if getattr(item, "type", "") == "text":
            parts.append(item.text)
        else:
            parts.append(json.dumps(item.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


# -- Composio ---------------------------------------------------------------------------------


def composio_tools(
    spec: ToolSpec,
    *,
    base_url: str,
    api_key: str,
    timeout: float,
    note: Callable[[str], None],
    egress: EgressPolicy,
) -> list[Tool]:
    """The allowed tools of one Composio app, described by Composio's tool schemas."""
    app = str(spec.options["app"])
    user_id = str(spec.options.get("user_id") or "default")
    allowed = [str(t) for t in spec.options.get("allowed_tools") or []]

    def client() -> httpx.Client:
        return guarded_client(
            egress,
            places=RUNS,
            max_answer_bytes=MAX_ANSWER_BYTES,
            base_url=base_url.rstrip("/"),
            headers={"x-api-key": api_key},
            timeout=timeout,
        )

    try:
        with client() as http:
            if "*" in allowed:
                resp = http.get("/api/v3/tools", params={"toolkit_slug": app, "limit": 200})
                resp.raise_for_status()
                items = [i for i in resp.json().get("items", []) if isinstance(i, dict)]
            else:
                items = []
                for slug in allowed:
                    resp = http.get(f"/api/v3/tools/{_segment(slug)}")
                    if resp.status_code == 404:
                        note(f"Composio has no tool {slug} (listed in allowed_tools of {app})")
                        continue
                    resp.raise_for_status()
                    items.append(resp.json())
    except (httpx.HTTPError, ValueError, AttributeError, EgressRefused) as exc:
        raise SourceUnavailable(
            f"Composio tools of '{app}' cannot be listed: {describe_failure(exc)}"
        ) from exc

    def caller(slug: str) -> Callable[[dict[str, Any]], str]:
        def run(args: dict[str, Any]) -> str:
            try:
                with client() as http:
                    resp = http.post(
                        f"/api/v3/tools/execute/{_segment(slug)}",
                        json={"arguments": args, "user_id": user_id},
                    )
                    body = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise ToolError(f"Composio call {slug} failed: {describe_failure(exc)}") from exc
            if not isinstance(body, dict):
                raise ToolError(f"Composio call {slug} answered HTTP {resp.status_code}")
            if resp.is_error or not body.get("successful", False):
                error = body.get("error")
                # The tool's own error is the model's to read; bounded.
                text = str(error)[:COMPOSIO_ERROR_CAP] if error else ""
                raise ToolError(text or f"Composio answered {resp.status_code}")
            return json.dumps(body.get("data"))

        return run

    tools = []
    source = f"Composio app '{app}'"
    for item in items:
        slug = str(item.get("slug") or "")
        if not slug or not _allowed(spec, slug):
            continue
        described = _described(
            source,
            slug,
            item.get("description") or item.get("name") or slug,
            item.get("input_parameters") or None,
            note,
        )
        if described is None:
            continue
        tools.append(
            Tool(
                name=_model_name(slug),
                description=described[0],
                input_schema=described[1],
                run=caller(slug),
                gated=spec.gated,
                source="composio",
            )
        )
    return _kept(source, tools, note)
