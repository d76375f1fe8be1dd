"""Replays of agent runs from their recordings, through the real server, the anthropic SDK
against the Messages stand-in, an MCP server and an HTTP service that count every call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlmodel import select

from floom.bundle import read_folder
from floom.services.runs import agent as agent_runs
from floom.services.runs.rules import FINISHED
from floom.store.agents import ToolCall
from floom.store.db import session_scope
from floom.vocabulary import ToolCallStatus
from tests.standins.anthropic_api import reply, text, tool_use
from tests.standins.mcp_tracker import tracker_server
from tests.support.harness import make_worker, wait_until
from tests.support.mcp_clients import call, http_client
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status

TOKEN = "trk-token-31337"


def triage_yml(tracker_url: str, *, extra_tools: str = "", replay: str = "") -> str:
    return f"""\
name: triage
outputs:
  summary: string
  count: integer
tools:
  - builtin: read_file
  - mcp:
      name: tracker
      url: {tracker_url}
      auth_secret: TRACKER_TOKEN
      allowed_tools: [list_issues, create_issue]
  - builtin: http_request
    name: post_update
    allow_domains: [api.example.test]
    methods: [POST]
    approval: always
{extra_tools}{replay}"""


@pytest.fixture
def tracker() -> Iterator[dict[str, Any]]:
    with tracker_server(TOKEN) as t:
        yield t


def wait_report(api: httpx.Client, run_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = api.get(f"/api/v1/replays/{run_id}").json()
        return body if body["finished"] else None

    report: dict[str, Any] = wait_until(finished, timeout=60)
    return report


def replay(api: httpx.Client, run_id: str, **body: Any) -> dict[str, Any]:
    resp = api.post(f"/api/v1/runs/{run_id}/replays", json=body)
    assert resp.status_code == 202, resp.text
    started: dict[str, Any] = resp.json()
    assert (started["trigger"], started["replay_of"]) == ("replay", run_id)
    return wait_report(api, started["id"])


def recorded_run(rig: AgentRig, tmp_path: Path, tracker: dict[str, Any], **yml: str) -> str:
    """A finished run that used a builtin, an MCP tool, an unknown tool and an approved
    gated call, then finished with two outputs."""
    rig.deploy(agent_worker(tmp_path / "triage", triage_yml(tracker["url"], **yml)))
    rig.api.put("/api/v1/secrets/TRACKER_TOKEN", json={"value": TOKEN})
    post = {"method": "POST", "url": rig.url("/updates"), "json": {"text": "2 open"}}
    rig.model.script(
        reply(
            text("Looking at the tracker."),
            tool_use("tracker__list_issues", {"state_filter": "open"}),
            tool_use("read_file", {"path": "SKILL.md"}),
            tool_use("no_such_tool", {}),
        ),
        reply(tool_use("post_update", post), input_tokens=300, output_tokens=40),
        reply(tool_use("finish", {"outputs": {"summary": "2 open issues", "count": 2}})),
    )
    run_id = start_run(rig.api, "triage")
    # Generous: listing an MCP server's tools is slow on a loaded machine.
    paused = wait_status(rig.api, run_id, {"awaiting_approval", *FINISHED}, timeout=90)
    assert paused["status"] == "awaiting_approval", paused
    approval = paused["approvals"][0]
    assert rig.api.post(f"/api/v1/approvals/{approval['id']}/approve").status_code == 200
    run = wait_status(rig.api, run_id, timeout=60)
    assert run["status"] == "succeeded", run
    return run_id


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as r:
        yield r


def test_an_exact_replay_reproduces_a_run_without_calling_the_model_or_any_tool(
    rig: AgentRig, tmp_path: Path, tracker: dict[str, Any]
) -> None:
    run_id = recorded_run(rig, tmp_path, tracker)
    model_requests, tool_calls, posts = (
        len(rig.model.requests),
        list(tracker["calls"]),
        list(rig.echo["requests"]),
    )
    approvals = rig.api.get("/api/v1/approvals", params={"status": "all"}).json()["items"]

    report = replay(rig.api, run_id, mode="exact")

    assert report["reproduced"] is True, report["divergence"]
    assert report["status"] == "succeeded"
    assert report["mode"] == "exact"
    diff = report["diff"]
    assert diff["outputs"]["equal"]
    assert not diff["tool_calls"]["diverged"]
    assert diff["turns"] == {"original": 3, "replay": 3}
    assert diff["tokens"]["replay"] == diff["tokens"]["original"] == 120 + 340 + 120
    # Neither the model, nor the MCP server, nor the HTTP service heard from the replay,
    # and nobody was asked to approve anything.
    assert len(rig.model.requests) == model_requests
    assert tracker["calls"] == tool_calls
    assert rig.echo["requests"] == posts
    after = rig.api.get("/api/v1/approvals", params={"status": "all"}).json()["items"]
    assert len(after) == len(approvals)
    replayed = rig.api.get(f"/api/v1/runs/{report['run_id']}").json()
    original = rig.api.get(f"/api/v1/runs/{run_id}").json()
    assert [(c["tool"], c["status"]) for c in replayed["tool_calls"]] == [
        (c["tool"], c["status"]) for c in original["tool_calls"]
    ]
    assert replayed["outputs"] == original["outputs"]


def test_an_exact_replay_reports_the_first_step_where_the_record_is_handled_differently(
    rig: AgentRig, tmp_path: Path, tracker: dict[str, Any]
) -> None:
    run_id = recorded_run(rig, tmp_path, tracker)
    # As if an older floom had stored the second call's outcome differently.
    with session_scope(rig.server.ctx.engine, write=True) as s:
        row = s.exec(select(ToolCall).where(ToolCall.run_id == run_id, ToolCall.seq == 2)).one()
        row.status = ToolCallStatus.ERROR
        s.add(row)

    report = replay(rig.api, run_id, mode="exact")

    assert report["reproduced"] is False
    assert report["divergence"]["step"] == "tool call 2"
    assert report["divergence"]["expected"]["status"] == "error"
    assert report["divergence"]["actual"]["status"] == "ok"


def test_an_exact_replay_whose_tool_call_arguments_differ_is_not_called_reproduced(
    rig: AgentRig, tmp_path: Path, tracker: dict[str, Any]
) -> None:
    run_id = recorded_run(rig, tmp_path, tracker)
    # As if an older floom had stored the first call's arguments otherwise.
    with session_scope(rig.server.ctx.engine, write=True) as s:
        row = s.exec(select(ToolCall).where(ToolCall.run_id == run_id, ToolCall.seq == 1)).one()
        row.arguments_json = json.dumps({"state_filter": "closed"})
        s.add(row)

    report = replay(rig.api, run_id, mode="exact")

    assert report["diff"]["tool_calls"]["diverged"] is True
    assert report["reproduced"] is False
    assert report["divergence"]["step"] == "tool call 1"
    assert report["divergence"]["expected"]["arguments"] == {"state_filter": "closed"}
    assert report["divergence"]["actual"]["arguments"] == {"state_filter": "open"}


def test_an_exact_replay_ends_with_the_files_the_originals_tools_wrote(
    rig: AgentRig, tmp_path: Path
) -> None:
    yml = "name: writer\noutputs:\n  done: boolean\ntools:\n  - builtin: write_file\n"
    rig.deploy(agent_worker(tmp_path / "writer", yml))
    rig.model.script(
        reply(tool_use("write_file", {"path": "output/notes.md", "content": "# found 2\n"})),
        reply(tool_use("finish", {"outputs": {"done": True}})),
    )
    run_id = start_run(rig.api, "writer")
    assert wait_status(rig.api, run_id, timeout=60)["status"] == "succeeded"
    original = rig.api.get(f"/api/v1/runs/{run_id}/artifacts").json()["items"]
    assert [a["name"] for a in original] == ["notes.md"]

    report = replay(rig.api, run_id, mode="exact")

    assert report["reproduced"] is True, report["divergence"]
    replayed = rig.api.get(f"/api/v1/runs/{report['run_id']}/artifacts").json()["items"]
    assert [(a["name"], a["size"]) for a in replayed] == [("notes.md", 10)]
    body = rig.api.get(f"/api/v1/runs/{report['run_id']}/artifacts/notes.md")
    assert body.content == b"# found 2\n"


def test_a_replay_of_a_run_that_has_not_finished_or_is_a_script_run_is_refused(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(make_worker(tmp_path / "s", "name: s\n", {"run.py": "print('hi')\n"}))
    script_run = wait_status(rig.api, start_run(rig.api, "s"))
    resp = rig.api.post(f"/api/v1/runs/{script_run['id']}/replays", json={"mode": "exact"})
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "not_replayable"
    resp = rig.api.post(f"/api/v1/runs/{script_run['id']}/replays", json={"mode": "sideways"})
    assert resp.status_code in (400, 422), resp.text
    resp = rig.api.post("/api/v1/runs/run_nope/replays", json={"mode": "exact"})
    assert resp.status_code == 404, resp.text


@pytest.fixture
def lite_rig(tmp_path: Path) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}") as r:
        yield r


def test_a_what_if_replay_answers_from_the_recording_refuses_new_calls_and_diffs_them(
    lite_rig: AgentRig, tmp_path: Path, tracker: dict[str, Any]
) -> None:
    rig = lite_rig
    run_id = recorded_run(rig, tmp_path, tracker)
    extra = """\
  - builtin: http_request
    name: fetch
    allow_domains: [api.example.test]
  - builtin: remember
"""
    folder = agent_worker(
        tmp_path / "triage2",
        triage_yml(
            tracker["url"],
            extra_tools=extra,
            replay="replay:\n  live_tools: [fetch]\n",
        ),
        skill="Triage the tracker, then file a follow-up issue.",
    )
    version = rig.api.post(
        "/api/v1/workers",
        content=read_folder(folder, max_bytes=1 << 20).to_archive(),
        headers={"Content-Type": "application/gzip"},
    ).json()["version"]["id"]
    calls_before, posts_before = list(tracker["calls"]), len(rig.echo["requests"])
    asked = len(rig.model.requests)
    rig.model.script(
        reply(
            tool_use("tracker__list_issues", {"state_filter": " open "}),
            tool_use("tracker__create_issue", {"title": "Follow up"}),
            tool_use("fetch", {"url": rig.url("/status")}),
            tool_use("fetch", {"method": "POST", "url": rig.url("/status")}),
            tool_use("remember", {"key": "seen", "value": 2}),
        ),
        reply(tool_use("finish", {"outputs": {"summary": "2 open, 1 filed", "count": 2}})),
    )

    report = replay(rig.api, run_id, mode="what_if", version_id=version)

    assert report["status"] == "succeeded"
    assert report["version_id"] == version
    results = rig.model.tool_results(asked + 1)
    listed, created, fetched, posted, remembered = results
    assert "Login fails" in listed["content"]  # answered from the recording
    for refused in (created, posted, remembered):
        assert refused["is_error"]
        assert refused["content"].startswith("not in the recording")
    assert json.loads(fetched["content"])["status"] == 200  # marked safe: called live
    # The world saw only the one read-only request marked safe.
    assert tracker["calls"] == calls_before
    assert [r["method"] for r in rig.echo["requests"][posts_before:]] == ["GET"]
    assert report["refused_calls"] == 3
    assert "Triage the tracker, then file" in rig.model.requests[asked]["system"]
    assert TOKEN not in json.dumps(rig.model.requests[asked:])
    diff = report["diff"]
    assert diff["outputs"]["different"] == {
        "summary": {"original": "2 open issues", "replay": "2 open, 1 filed", "rule": "exact"}
    }
    added = {(c["tool"], c["status"]) for c in diff["tool_calls"]["added"]}
    assert ("tracker__create_issue", "refused") in added
    assert ("remember", "refused") in added
    removed = {c["tool"] for c in diff["tool_calls"]["removed"]}
    assert {"read_file", "post_update", "no_such_tool"} <= removed
    assert diff["turns"] == {"original": 3, "replay": 2}
    assert diff["cost_usd"]["replay"] > 0
    # A replay writes nothing outside its own run: no memory, no approvals, no child runs.
    assert agent_runs.memory_writes(rig.server.ctx, worker_name="triage") == []
    replay_run = rig.api.get(f"/api/v1/runs/{report['run_id']}").json()
    assert replay_run["approvals"] == []
    assert replay_run["trigger"] == "replay"
    children = rig.api.get("/api/v1/runs", params={"worker": "triage"}).json()["items"]
    assert all(r["parent_run_id"] is None for r in children)
    # The same replays over MCP: the report of this one, and an exact replay of the original.

    async def over_mcp() -> None:
        async with http_client(rig.server) as mcp:
            again = await call(mcp, "get_replay", run_id=report["run_id"])
            assert again["diff"] == report["diff"]
            exact = await call(mcp, "replay_recorded_run", run_id=run_id, wait_seconds=60)
            assert exact["reproduced"] is True
            assert exact["mode"] == "exact"

    anyio.run(over_mcp)
