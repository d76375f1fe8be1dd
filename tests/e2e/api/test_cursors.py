"""A page cursor that no list handed out is refused, naming `cursor`, on every surface that
pages: each REST route whose OpenAPI operation takes `cursor` (walked from the document, so a
new paged route is covered), each MCP tool with a `cursor` argument, the UI's paged lists and
the CLI. Before, a malformed cursor read as "no more pages" (an empty 200), or as the first
page, or (state versions, "²") as a server error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from floom.services.workers.state import MAX_VERSION
from tests.support.cli import cli
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder
from tests.support.mcp_clients import http_client
from tests.support.web import signed_in_client

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

# Each malformed in its own way for every list (ids, worker names, numbers): spaces, an id
# of another list, a digit `int` refuses, a number past every state version, a path, an id
# with upper-case hex.
MALFORMED = ["not a cursor", "key_0123abcd", "²", str(MAX_VERSION + 1), "../x", "run_0123ABCD"]


def _paged_operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            if "cursor" in names:
                found.append((method.upper(), path))
    return found


def _refuses_cursor(status: int, body: dict[str, Any]) -> bool:
    error = body.get("error") or {}
    return (
        status == 400
        and error.get("code") == "invalid_request"
        and (error.get("details") or {}).get("parameter") == "cursor"
        and "cursor" in error.get("message", "")
        and "next_cursor" in (error.get("hint") or "")
    )


@on_sqlite
def test_every_paged_route_refuses_a_cursor_it_never_handed_out(server: LiveServer) -> None:
    api = server.client()
    deploy_folder(api, EXAMPLES / "hello")
    paged = _paged_operations(api.get("/openapi.json").json())
    assert len(paged) >= 7, paged
    wrong = []
    for method, path in paged:
        url = re.sub(r"\{name\}", "hello", path)
        assert "{" not in url, f"{path}: give the walk a value for its path parameter"
        for cursor in MALFORMED:
            resp = api.request(method, url, params={"cursor": cursor})
            if not _refuses_cursor(resp.status_code, resp.json()):
                wrong.append(f"{method} {path}?cursor={cursor!r}: {resp.status_code} {resp.text}")
        # No cursor at all, and an empty one, are the first page.
        for params in ({}, {"cursor": ""}):
            first = api.request(method, url, params=params)
            if first.status_code != 200:
                wrong.append(f"{method} {path} {params}: {first.status_code} {first.text}")
    assert wrong == [], "\n".join(wrong)


@on_sqlite
def test_a_handed_out_cursor_still_pages(server: LiveServer) -> None:
    api = server.client()
    deploy_folder(api, EXAMPLES / "hello")
    for _ in range(3):
        api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "x"}}).raise_for_status()
    first = api.get("/api/v1/runs", params={"limit": 2}).json()
    assert first["next_cursor"]
    second = api.get("/api/v1/runs", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert len(second["items"]) == 1
    assert {r["id"] for r in first["items"]}.isdisjoint(r["id"] for r in second["items"])


@on_sqlite
def test_every_mcp_tool_with_a_cursor_refuses_one_it_never_handed_out(
    server: LiveServer,
) -> None:
    deploy_folder(server.client(), EXAMPLES / "hello")
    wrong: list[str] = []

    async def walk() -> None:
        async with http_client(server) as mcp:
            tools = (await mcp.list_tools()).tools
            paged = [t for t in tools if "cursor" in t.input_schema.get("properties", {})]
            assert len(paged) >= 6, [t.name for t in paged]
            for tool in paged:
                needs = tool.input_schema.get("required", [])
                arguments: dict[str, Any] = {"worker": "hello"} if "worker" in needs else {}
                assert set(needs) <= set(arguments), f"{tool.name} needs {needs}"
                for cursor in ("not a cursor", "²", "../x"):
                    result = await mcp.call_tool(tool.name, {**arguments, "cursor": cursor})
                    error = (result.structured_content or {}).get("error") or {}
                    if error.get("code") != "invalid_request" or "cursor" not in error.get(
                        "message", ""
                    ):
                        wrong.append(f"{tool.name}(cursor={cursor!r}): {result.structured_content}")

    anyio.run(walk)
    assert wrong == [], "\n".join(wrong)


@on_sqlite
def test_the_ui_s_paged_lists_and_the_cli_refuse_a_malformed_cursor(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, EXAMPLES / "hello")
    browser = signed_in_client(server, server.admin_key)
    for page in ("/runs", "/"):
        resp = browser.get(page, params={"cursor": "Z/Z"})
        assert resp.status_code == 400, (page, resp.status_code)
        assert "cursor" in resp.text
    listed = cli(server, "runs", "--cursor", "run_xyz")
    assert listed.returncode != 0
    assert "cursor 'run_xyz'" in listed.stderr + listed.stdout
    assert "next_cursor" in listed.stderr + listed.stdout


def _enum_filters(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(method, path, parameter) of each query parameter the document declares as an enum."""
    found = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for param in op.get("parameters", []):
                schema = param.get("schema", {})
                options = [schema, *schema.get("anyOf", [])]
                if param["in"] == "query" and any("enum" in o for o in options):
                    found.append((method.upper(), path, param["name"]))
    return found


@on_sqlite
def test_every_enumerated_filter_refuses_a_value_outside_its_enum(server: LiveServer) -> None:
    # A value the document does not list would otherwise read as "nothing matches" (an
    # empty 200), which a caller cannot tell from a typo: `trigger` on runs did that.
    api = server.client()
    deploy_folder(api, EXAMPLES / "hello")
    filters = _enum_filters(api.get("/openapi.json").json())
    assert ("GET", "/api/v1/runs", "trigger") in filters, filters
    wrong = []
    for method, path, name in filters:
        url = re.sub(r"\{name\}", "hello", path)
        for value in ("nope", "\x00", "Schedule", "z" * 10_000):
            resp = api.request(method, url, params={name: value})
            error = resp.json().get("error") or {} if resp.status_code < 500 else {}
            if resp.status_code not in (400, 422) or error.get("code") != "invalid_request":
                wrong.append(f"{method} {path}?{name}={value[:20]!r}: {resp.status_code}")
            # The refusal quotes the value short: a 10 KB one was answered back whole.
            elif len(resp.content) > 1_000:
                wrong.append(f"{method} {path}?{name}: {len(resp.content)} bytes answered")
    assert wrong == [], "\n".join(wrong)
