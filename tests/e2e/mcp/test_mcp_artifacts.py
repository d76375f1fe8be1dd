"""A run's artifacts read by an agent through the SDK's own client, over /mcp (the services in
the server) and over stdio (`floom mcp`, a client of the REST API): text inline up to the
bound with its secrets redacted, binary and larger files as a link with type and size."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from floom.mcp.server import FloomMCPServer
from floom.mcp.tools.artifacts import LINK_MEDIA_TYPE, MAX_INLINE_ARTIFACT_BYTES
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.mcp_clients import call, call_error, call_raw, http_client, stdio_client, text_of

TOKEN = "tok-artifact-7f3e9a1c"
WRITER_YML = "name: writer\nsecrets: [ART_TOKEN]\n"
# A text file naming the secret, a nested CSV, a PNG's first bytes and a text over the bound.
WRITER_PY = f"""\
import os
out = os.environ["FLOOM_OUTPUT_DIR"]
os.makedirs(os.path.join(out, "tables"))
open(os.path.join(out, "notes.txt"), "w").write("token=" + os.environ["ART_TOKEN"] + "\\n")
open(os.path.join(out, "tables", "data.csv"), "w").write("a,b\\n1,2\\n")
open(os.path.join(out, "pixel.png"), "wb").write(b"\\x89PNG\\r\\n\\x1a\\n\\x00\\x00\\x00\\rIHDR")
open(os.path.join(out, "big.txt"), "w").write("x" * {MAX_INLINE_ARTIFACT_BYTES + 1})
"""
# These tests are about reading artifacts through MCP; the stores behind them are walked in
# the other tests, so one database is enough.
ONE_DATABASE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

Connect = Callable[[LiveServer], AbstractAsyncContextManager[Client]]


def _over_http(server: LiveServer) -> AbstractAsyncContextManager[Client]:
    return http_client(server)


def _over_stdio(server: LiveServer) -> AbstractAsyncContextManager[Client]:
    return stdio_client(server)


TRANSPORTS = pytest.mark.parametrize("connect", [_over_http, _over_stdio], ids=["http", "stdio"])


def _finished_writer_run(server: LiveServer, api: httpx.Client, tmp_path: Path) -> str:
    assert api.put("/api/v1/secrets/ART_TOKEN", json={"value": TOKEN}).status_code == 200
    deploy_folder(api, make_worker(tmp_path / "writer", WRITER_YML, {"run.py": WRITER_PY}))
    run_id: str = api.post("/api/v1/workers/writer/runs", json={}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"
    return run_id


@ONE_DATABASE
@TRANSPORTS
def test_an_agent_reads_text_artifacts_inline_and_gets_binary_and_large_ones_as_links(
    server: LiveServer, api: httpx.Client, tmp_path: Path, connect: Connect
) -> None:
    run_id = _finished_writer_run(server, api, tmp_path)

    async def session() -> None:
        async with connect(server) as mcp:
            shown = await call_raw(mcp, "get_run", run_id=run_id)
            listed = {a["name"]: a for a in (shown.structured_content or {})["artifacts"]}
            assert set(listed) == {"notes.txt", "tables/data.csv", "pixel.png", "big.txt"}
            # The run's summary names each file and the tool that reads one.
            assert f"get_artifact(run_id='{run_id}', name='big.txt')" in text_of(shown)
            png = listed["pixel.png"]
            assert png["download_url"] == (
                f"{server.base_url}/api/v1/runs/{run_id}/artifacts/pixel.png"
            )
            assert png["uri"] == f"floom://runs/{run_id}/artifacts/pixel.png"

            notes = await call_raw(mcp, "get_artifact", run_id=run_id, name="notes.txt")
            body = notes.structured_content or {}
            # Stored redacted when the run ended, and so shown: the value never comes back.
            assert body["inline"] is True
            assert body["text"] == "token=***\n"
            assert TOKEN not in text_of(notes)
            assert "token=***" in text_of(notes)
            table = await call(mcp, "get_artifact", run_id=run_id, name="tables/data.csv")
            assert table["text"] == "a,b\n1,2\n"
            assert table["content_type"] == "text/csv"

            binary = await call_raw(mcp, "get_artifact", run_id=run_id, name="pixel.png")
            link = binary.structured_content or {}
            assert link["inline"] is False
            assert "text" not in link
            assert link["why"] == "binary"
            assert link["content_type"] == "image/png"
            assert link["size"] == 16
            assert link["download_url"] in text_of(binary)
            assert "bearer" in text_of(binary)
            large = await call(mcp, "get_artifact", run_id=run_id, name="big.txt")
            assert large["inline"] is False
            assert "text" not in large
            assert large["size"] == MAX_INLINE_ARTIFACT_BYTES + 1
            assert str(MAX_INLINE_ARTIFACT_BYTES) in large["why"]

            missing = await call_error(mcp, "get_artifact", run_id=run_id, name="nope.txt")
            assert missing["code"] == "not_found"
            assert "notes.txt" in missing["hint"]
            missing = await call_error(mcp, "get_artifact", run_id="run_nope", name="x")
            assert missing["code"] == "not_found"

            # The link works with the agent's own key, and gives the file as the worker wrote it.
            resp = api.get(link["download_url"])
            assert resp.status_code == 200
            assert resp.content.startswith(b"\x89PNG")

    anyio.run(session)


@ONE_DATABASE
@TRANSPORTS
def test_artifacts_are_resources_with_their_media_type_or_a_link(
    server: LiveServer, api: httpx.Client, tmp_path: Path, connect: Connect
) -> None:
    run_id = _finished_writer_run(server, api, tmp_path)

    async def session() -> None:
        async with connect(server) as mcp:
            templates = (await mcp.list_resource_templates()).resource_templates
            assert "floom://runs/{run_id}/artifacts/{+name}" in {t.uri_template for t in templates}

            table = await mcp.read_resource(f"floom://runs/{run_id}/artifacts/tables/data.csv")
            (content,) = table.contents
            assert getattr(content, "text", None) == "a,b\n1,2\n"
            assert content.mime_type == "text/csv"
            notes = await mcp.read_resource(f"floom://runs/{run_id}/artifacts/notes.txt")
            assert getattr(notes.contents[0], "text", None) == "token=***\n"

            binary = await mcp.read_resource(f"floom://runs/{run_id}/artifacts/pixel.png")
            (content,) = binary.contents
            assert content.mime_type == LINK_MEDIA_TYPE
            link = json.loads(getattr(content, "text", ""))
            assert link["content_type"] == "image/png"
            assert link["size"] == 16
            assert link["download_url"].endswith(f"/api/v1/runs/{run_id}/artifacts/pixel.png")

            with pytest.raises(MCPError, match=r"no artifact 'nope\.txt'"):
                await mcp.read_resource(f"floom://runs/{run_id}/artifacts/nope.txt")

    anyio.run(session)


def test_the_tool_description_states_the_inline_bound() -> None:
    server = FloomMCPServer(backend_for=_no_backend, load_workers=list)

    async def described() -> str:
        tools = {t.name: t for t in await server.list_tools()}
        return tools["get_artifact"].description or ""

    assert f"{MAX_INLINE_ARTIFACT_BYTES // 1024} KiB" in anyio.run(described)


def _no_backend(_ctx: object) -> Any:
    raise AssertionError("listing tools needs no backend")
