"""What floom stored about a run (its error, the notices it logged) names what to do in the
reader's terms: REST requests for a plain REST client, tools over MCP, pages at the web UI,
`floom` commands for floom's CLI, on every read of it: the run, run lists, the worker's recent
runs, the log page and the log stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.mcp_clients import call, call_raw, http_client, text_of
from tests.support.rigs.agents import wait_status
from tests.support.web import signed_in_client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

CLI = {"X-Floom-Client": "cli"}
SECRET_COMMAND = "`floom secrets set NEVER_SET_TOKEN`"
SECRET_REQUEST = '`PUT /api/v1/secrets/NEVER_SET_TOKEN {"value": "VALUE"}`'
SECRET_TOOL = "set_secret(name='NEVER_SET_TOKEN', value=VALUE)"


def _runs(api: httpx.Client, tmp_path: Path) -> tuple[str, str, str]:
    """A run that failed for a secret never set, and one that waits for its approval (with
    the approval's id); floom stored each with a `floom` command in it."""
    deploy_folder(
        api,
        make_worker(
            tmp_path / "needy", "name: needy\nsecrets: [NEVER_SET_TOKEN]\n", {"run.py": ""}
        ),
    )
    deploy_folder(
        api,
        make_worker(
            tmp_path / "gated",
            "name: gated\noutputs: {n: integer}\napprovals: {required: true}\n",
            {"run.py": 'import json\njson.dump({"outputs": {"n": 1}}, open("result.json", "w"))\n'},
        ),
    )
    needy = api.post("/api/v1/workers/needy/runs", json={}).json()["id"]
    gated = api.post("/api/v1/workers/gated/runs", json={}).json()["id"]
    assert wait_for_run(api, needy)["error"]["code"] == "secret_missing"
    approval = wait_status(api, gated, {"awaiting_approval"})["approvals"][0]["id"]
    return needy, gated, approval


def _notice(page: dict[str, Any]) -> str:
    (line,) = [e["line"] for e in page["items"] if "awaiting approval" in e["line"]]
    return str(line)


def _sse_end(
    api: httpx.Client, run_id: str, headers: dict[str, str], *, prefix: str = "/api/v1"
) -> dict[str, Any]:
    """The run the log stream of an ended run closes with."""
    with api.stream("GET", f"{prefix}/runs/{run_id}/logs/stream", headers=headers) as stream:
        event = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "end":
                body: dict[str, Any] = json.loads(line.removeprefix("data: "))
                return body
    raise AssertionError("the stream ended without an end event")


def test_a_plain_rest_client_reads_stored_notices_as_rest_requests(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    needy, gated, approval = _runs(api, tmp_path)

    reads = [
        api.get(f"/api/v1/runs/{needy}").json(),
        api.get("/api/v1/runs", params={"worker": "needy"}).json()["items"][0],
        api.get("/api/v1/workers/needy").json()["recent_runs"][0],
        _sse_end(api, needy, {}),
    ]
    for run in reads:
        assert SECRET_REQUEST in run["error"]["message"], run
        assert "floom " not in run["error"]["message"]

    notice = _notice(api.get(f"/api/v1/runs/{gated}/logs").json())
    assert f"`POST /api/v1/approvals/{approval}/approve`" in notice
    assert f'`POST /api/v1/approvals/{approval}/reject {{"comment": "WHY"}}`' in notice
    assert "floom " not in notice
    assert "floom " not in json.dumps(api.get(f"/api/v1/runs/{gated}/logs?tail=5").json())


def test_floom_s_cli_reads_stored_notices_as_floom_commands(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    needy, gated, approval = _runs(api, tmp_path)

    assert (
        SECRET_COMMAND in api.get(f"/api/v1/runs/{needy}", headers=CLI).json()["error"]["message"]
    )
    assert SECRET_COMMAND in _sse_end(api, needy, CLI)["error"]["message"]
    notice = _notice(api.get(f"/api/v1/runs/{gated}/logs", headers=CLI).json())
    assert f"`floom approve {approval}`" in notice


def test_an_agent_over_mcp_reads_stored_notices_as_tool_calls_in_data_and_text(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    needy, gated, approval = _runs(api, tmp_path)

    async def over_mcp() -> None:
        async with http_client(server) as mcp:
            run = await call(mcp, "get_run", run_id=needy)
            assert SECRET_TOOL in run["error"]["message"]
            listed = await call(mcp, "list_runs", worker="needy")
            assert SECRET_TOOL in listed["items"][0]["error"]["message"]
            worker = await call(mcp, "get_worker", worker="needy")
            assert SECRET_TOOL in worker["recent_runs"][0]["error"]["message"]
            logs = await call(mcp, "get_run_logs", run_id=gated)
            assert f"decide_approval(approval_id='{approval}', decision='approve')" in _notice(logs)
            for tool, args in [
                ("get_run", {"run_id": needy}),
                ("list_runs", {}),
                ("get_run_logs", {"run_id": gated}),
                ("get_run_logs", {"run_id": needy}),
            ]:
                result = await call_raw(mcp, tool, **args)
                said = text_of(result) + json.dumps(result.structured_content)
                assert "`floom " not in said, (tool, said)
                assert "/api/v1/secrets" not in said, (tool, said)

    anyio.run(over_mcp)


def test_a_person_at_the_web_ui_reads_stored_notices_as_the_pages_that_act_on_them(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    needy, gated, _ = _runs(api, tmp_path)
    ui = signed_in_client(server, server.admin_key)

    failed = ui.get(f"/runs/{needy}").text
    assert "the Secrets page (/secrets), adding NEVER_SET_TOKEN" in failed
    assert "floom secrets" not in failed
    ended = _sse_end(ui, needy, {}, prefix="")
    assert "the Secrets page (/secrets)" in ended["error"]["message"]
    waiting = ui.get(f"/runs/{gated}").text
    assert "Approve on the Approvals page (/approvals)" in waiting
    assert "floom approve" not in waiting
    assert "floom reject" not in waiting
    missing = ui.get("/runs/run_nope").text  # an error page's hint too
    assert "the Runs page (/runs)" in missing
    assert "`floom runs`" not in missing
