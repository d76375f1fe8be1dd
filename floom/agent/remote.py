"""Remote tool sources: MCP servers over Streamable HTTP (the mcp SDK's Client) and Composio,
each filtered by the worker's allowed_tools before the model sees anything."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import httpx

from floom.agent.tools import Tool, ToolError
from floom.errors import SourceUnavailable
from floom.manifest_agent import ToolSpec

TOOL_NAME_CAP = 64


def _model_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:TOOL_NAME_CAP]


def _allowed(spec: ToolSpec, name: str) -> bool:
    allowed = spec.options.get("allowed_tools") or []
    return "*" in allowed or name in allowed


# -- MCP --------------------------------------------------------------------------------------


def mcp_tools(
    spec: ToolSpec, *, token: str | None, timeout: float, note: Callable[[str], None]
) -> list[Tool]:
    """The allowed tools of one MCP server. Each call opens its own session, so a paused run
    resumed in another process needs no state from this one."""
    url = str(spec.options["url"])
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    try:
        listed = asyncio.run(_mcp_list(url, headers, timeout))
    except Exception as exc:  # any transport or protocol failure means "unavailable"
        raise SourceUnavailable(
            f"MCP server '{spec.name}' ({url}) cannot list its tools: {_describe(exc)}"
        ) from exc
    tools = []
    seen = set()
    for item in listed:
        seen.add(item.name)
        if not _allowed(spec, item.name):
            continue
        tools.append(
            Tool(
                name=_model_name(f"{spec.name}__{item.name}"),
                description=item.description or item.title or item.name,
                input_schema=item.input_schema or {"type": "object"},
                run=_mcp_caller(url, headers, item.name, timeout),
                gated=spec.gated,
                source="mcp",
            )
        )
    for name in spec.options.get("allowed_tools") or []:
        if name != "*" and name not in seen:
            note(f"MCP server '{spec.name}' has no tool '{name}' (listed in allowed_tools)")
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"[:300]


async def _mcp_list(url: str, headers: dict[str, str], timeout: float) -> list[Any]:
    from mcp import Client

    tools: list[Any] = []
    async with (
        _mcp_client(url, headers, timeout) as transport,
        Client(transport, read_timeout_seconds=timeout, cache=None) as client,
    ):
        cursor = None
        for _ in range(50):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
    return tools


class _mcp_client:  # noqa: N801 - used like a function in `async with`
    """The Streamable HTTP transport with floom's headers, closing its HTTP client after."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float) -> None:
        self._url, self._headers, self._timeout = url, headers, timeout

    async def __aenter__(self) -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        self._http = httpx2.AsyncClient(
            headers=self._headers, timeout=httpx2.Timeout(self._timeout)
        )
        await self._http.__aenter__()
        return streamable_http_client(self._url, http_client=self._http)

    async def __aexit__(self, *exc: object) -> None:
        await self._http.__aexit__(None, None, None)


def _mcp_caller(
    url: str, headers: dict[str, str], name: str, timeout: float
) -> Callable[[dict[str, Any]], str]:
    def run(args: dict[str, Any]) -> str:
        try:
            result = asyncio.run(_mcp_call(url, headers, name, args, timeout))
        except Exception as exc:  # the server's failure is the model's to read
            raise ToolError(f"MCP call {name} failed: {_describe(exc)}") from exc
        text = _mcp_text(result)
        if result.is_error:
            raise ToolError(text or f"MCP tool {name} reported an error")
        return text

    return run


async def _mcp_call(
    url: str, headers: dict[str, str], name: str, args: dict[str, Any], timeout: float
) -> Any:
    from mcp import Client

    async with (
        _mcp_client(url, headers, timeout) as transport,
        Client(transport, read_timeout_seconds=timeout, cache=None) as client,
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
    spec: ToolSpec, *, base_url: str, api_key: str, timeout: float, note: Callable[[str], None]
) -> list[Tool]:
    """The allowed tools of one Composio app, described by Composio's tool schemas."""
    app = str(spec.options["app"])
    user_id = str(spec.options.get("user_id") or "default")
    allowed = [str(t) for t in spec.options.get("allowed_tools") or []]

    def client() -> httpx.Client:
        return httpx.Client(
            base_url=base_url.rstrip("/"), headers={"x-api-key": api_key}, timeout=timeout
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
                    resp = http.get(f"/api/v3/tools/{slug}")
                    if resp.status_code == 404:
                        note(f"Composio has no tool {slug} (listed in allowed_tools of {app})")
                        continue
                    resp.raise_for_status()
                    items.append(resp.json())
    except (httpx.HTTPError, ValueError) as exc:
        raise SourceUnavailable(f"Composio tools of '{app}' cannot be listed: {exc}") from exc

    def caller(slug: str) -> Callable[[dict[str, Any]], str]:
        def run(args: dict[str, Any]) -> str:
            try:
                with client() as http:
                    resp = http.post(
                        f"/api/v3/tools/execute/{slug}",
                        json={"arguments": args, "user_id": user_id},
                    )
                    body = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise ToolError(f"Composio call {slug} failed: {exc}") from exc
            if resp.is_error or not body.get("successful", False):
                raise ToolError(str(body.get("error") or f"Composio answered {resp.status_code}"))
            return json.dumps(body.get("data"))

        return run

    tools = []
    for item in items:
        slug = str(item.get("slug") or "")
        if not slug or not _allowed(spec, slug):
            continue
        tools.append(
            Tool(
                name=_model_name(slug),
                description=str(item.get("description") or item.get("name") or slug),
                input_schema=item.get("input_parameters") or {"type": "object"},
                run=caller(slug),
                gated=spec.gated,
                source="composio",
            )
        )
    return tools
