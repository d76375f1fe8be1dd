"""A worker's state over MCP, through the SDK's client: the /mcp endpoint and `floom mcp`."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.harness import LiveServer
from tests.support.mcp_clients import call, call_error, http_client, stdio_client
from tests.support.rigs.state import COUNTER_YML, counter_state, deploy_counter


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_mcp_tools_read_set_and_list_the_state_in_the_server_and_over_stdio(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    read_key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]

    async def session() -> None:
        async with http_client(server) as mcp:
            empty = await call(mcp, "get_worker_state", worker="counter")
            assert empty["current_version"] == 0
            assert empty["state"] is None
            written = await call(mcp, "set_worker_state", worker="counter", state={"n": 1})
            assert written["version"] == 1
            assert written["written"]["source"] == "operator"
            both = await call_error(
                mcp, "set_worker_state", worker="counter", state={"n": 2}, from_version=1
            )
            assert "exactly one" in both["message"]
        async with stdio_client(server) as mcp:
            await call(mcp, "set_worker_state", worker="counter", state={"n": 2})
            stale = await call_error(
                mcp, "set_worker_state", worker="counter", state={"n": 3}, if_version=1
            )
            assert stale["code"] == "state_conflict"
            old = await call(mcp, "get_worker_state", worker="counter", version=1)
            assert old["state"] == {"n": 1}
            assert old["current_version"] == 2
            page = await call(mcp, "list_worker_state_versions", worker="counter")
            assert [v["version"] for v in page["items"]] == [2, 1]
        async with stdio_client(server, read_key) as mcp:
            refused = await call_error(mcp, "set_worker_state", worker="counter", state=0)
            assert refused["code"] == "forbidden"

    anyio.run(session)
    assert counter_state(api)["state"] == {"n": 2}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_rollback_worker_restores_a_kept_state_with_the_code_over_both_backends(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path / "a")
    deploy_counter(api, tmp_path / "b", COUNTER_YML.replace("state: true", "state: {}"))
    newest, oldest = [v["id"] for v in api.get("/api/v1/workers/counter/versions").json()["items"]]
    for n in (1, 2):
        api.put("/api/v1/workers/counter/state", json={"state": {"n": n}})

    def active() -> str:
        return str(api.get("/api/v1/workers/counter").json()["active_version_id"])

    async def session() -> None:
        async with http_client(server) as mcp:
            missing = await call_error(
                mcp, "rollback_worker", worker="counter", version_id=oldest, state_version=99
            )
            assert missing["code"] == "not_found"
            assert "state version 99" in missing["message"]
            assert active() == newest  # both or neither
            await call(mcp, "rollback_worker", worker="counter", version_id=oldest, state_version=1)
            assert active() == oldest
            assert counter_state(api)["state"] == {"n": 1}
        async with stdio_client(server) as mcp:
            await call(mcp, "rollback_worker", worker="counter", version_id=newest, state_version=2)
            assert active() == newest
            restored = counter_state(api)
            assert restored["state"] == {"n": 2}
            assert restored["written"]["source"] == "restore"

    anyio.run(session)
