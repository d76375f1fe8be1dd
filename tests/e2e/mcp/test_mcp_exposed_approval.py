"""A worker exposed as an MCP tool whose run waits for a person: the agent is told it waits,
and how to decide it, not that it failed."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from tests.support.harness import LiveServer, deploy_folder, make_worker
from tests.support.mcp_clients import call, call_raw, http_client, stdio_client, text_of

GATED_YML = """\
name: publish
description: Publishes a post once a person approves its title.
outputs:
  title: {type: string, required: true}
approvals: {required: true}
expose: [mcp]
"""
GATED_PY = """\
import json, os
if os.environ["FLOOM_PHASE"] == "propose":
    json.dump({"outputs": {"title": "Draft title"}}, open("result.json", "w"))
else:
    print("publishing", json.load(open("decision.json"))["outputs"]["title"], flush=True)
"""

Connect = Callable[[LiveServer], AbstractAsyncContextManager[Client]]


def _stdio(server: LiveServer) -> AbstractAsyncContextManager[Client]:
    return stdio_client(server)


def _http(server: LiveServer) -> AbstractAsyncContextManager[Client]:
    return http_client(server)


@pytest.mark.parametrize("connect", [_stdio, _http], ids=["stdio", "http"])
def test_an_exposed_worker_awaiting_approval_says_it_waits_and_how_to_decide_it(
    server: LiveServer, api: httpx.Client, tmp_path: Path, connect: Connect
) -> None:
    deploy_folder(api, make_worker(tmp_path / "publish", GATED_YML, {"run.py": GATED_PY}))

    async def session() -> None:
        async with connect(server) as mcp:
            (tool,) = [t for t in (await mcp.list_tools()).tools if t.name == "publish"]
            # Its description says a run may wait for a person, and what it then returns.
            assert "approval_id for decide_approval" in (tool.description or "")
            result = await call_raw(mcp, "publish")
            assert not result.is_error, text_of(result)
            waiting = result.structured_content
            assert waiting is not None
            run_id = waiting["run_id"]
            assert waiting["status"] == "awaiting_approval"
            assert waiting["outputs"] == {"title": "Draft title"}
            (approval,) = api.get("/api/v1/approvals", params={"run_id": run_id}).json()["items"]
            assert waiting["approval_id"] == approval["id"]
            text = text_of(result)
            assert run_id in text
            assert approval["id"] in text
            assert "decide_approval" in text
            assert "failed" not in text
            assert "ended" not in text

            # Following the reply's advice finishes the run; the decision can wait for its end
            # as run_worker and replay_run do.
            decided = await call(
                mcp,
                "decide_approval",
                approval_id=approval["id"],
                decision="approve",
                wait_seconds=30,
            )
            assert decided["status"] == "approved"
            assert decided["finished"] is True
            assert decided["run"]["status"] == "succeeded"
            logs = await call(mcp, "get_run_logs", run_id=run_id)
            assert any("publishing Draft title" in e["line"] for e in logs["items"])

    anyio.run(session)
