"""Evals over recorded runs and the eval gate on deploy, through the real server and the
anthropic SDK against the Messages stand-in (answers chosen from each request's inputs)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from floom.bundle import read_folder
from tests.standins.anthropic_api import reply, tool_use
from tests.support.harness import wait_until
from tests.support.mcp_clients import call, call_error, http_client, worker_files
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status
from tests.support.web import signed_in_client

RUNS = 10
LOOKUP_YML = """\
name: lookup
inputs:
  item: integer
outputs:
  answer: string
  score: number
tools:
  - builtin: http_request
    name: lookup
    allow_domains: [api.example.test]
    methods: [GET]
"""


def agent(
    answer: Callable[[int], dict[str, Any]], url: Callable[[int], str]
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A model turn chosen from the request: look the item up first, then finish."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        first = body["messages"][0]["content"]
        item = json.loads(first[first.index("{") : first.rindex("}") + 1])["item"]
        if len(body["messages"]) == 1:
            return reply(tool_use("lookup", {"url": url(item)}))
        return reply(tool_use("finish", {"outputs": answer(item)}))

    return respond


def deploy(api: httpx.Client, folder: Path, **params: str) -> httpx.Response:
    return api.post(
        "/api/v1/workers",
        content=read_folder(folder, max_bytes=1 << 20).to_archive(),
        headers={"Content-Type": "application/gzip"},
        params=params,
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRig]:
    """Ten recorded runs, shared by the tests below (the gate test runs last: it changes the
    active version)."""
    tmp = tmp_path_factory.mktemp("evals")
    with agent_rig(tmp / "data", f"sqlite:///{tmp / 'floom.db'}") as r:
        r.deploy(agent_worker(tmp / "v1", LOOKUP_YML))
        r.model.script(
            *[agent(lambda i: {"answer": f"item {i}", "score": i}, lambda i: r.url(f"/{i}"))]
            * (2 * RUNS)
        )
        ids = [start_run(r.api, "lookup", {"item": i}) for i in range(RUNS)]
        for run_id in ids:
            assert wait_status(r.api, run_id, timeout=60)["status"] == "succeeded"
        yield r


def wait_eval(api: httpx.Client, eval_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = api.get(f"/api/v1/evals/{eval_id}").json()
        return body if body["finished"] else None

    report: dict[str, Any] = wait_until(finished, timeout=90)
    return report


def test_an_eval_over_ten_recorded_runs_reports_the_right_counts(
    rig: AgentRig, tmp_path: Path
) -> None:
    compare = "replay:\n  compare:\n    score: {tolerance: 0.5}\n"
    v2 = deploy(
        rig.api, agent_worker(tmp_path / "v2", LOOKUP_YML + compare, skill="Look it up twice.")
    ).json()["version"]["id"]
    # Items 0-2 now answer differently; every score moves within the tolerance; item 9
    # looks up another address, which the recording cannot answer.
    rig.model.script(
        *[
            agent(
                lambda i: {"answer": f"item {i}" if i > 2 else "?", "score": i + 0.25},
                lambda i: rig.url("/elsewhere" if i == 9 else f"/{i}"),
            )
        ]
        * (2 * RUNS)
    )
    posts = len(rig.echo["requests"])

    started = rig.api.post(
        "/api/v1/workers/lookup/evals", json={"runs": f"last:{RUNS}", "version_id": v2}
    )
    assert started.status_code == 202, started.text
    report = wait_eval(rig.api, started.json()["id"])

    totals = report["totals"]
    assert (totals["runs"], totals["finished"]) == (RUNS, RUNS)
    assert (totals["outputs_equal"], totals["outputs_different"]) == (7, 3)
    assert (totals["tool_calls_diverged"], totals["refused_calls"]) == (1, 1)
    assert totals["tokens"]["original"] == totals["tokens"]["replay"] == RUNS * 240
    different = sorted(i["original_run_id"] for i in report["items"] if not i["outputs_equal"])
    assert len(different) == 3
    assert all(i["outputs_different"] in ([], ["answer"]) for i in report["items"])
    assert len(rig.echo["requests"]) == posts  # every lookup answered from the recording
    bad = rig.api.post("/api/v1/workers/lookup/evals", json={"runs": "last:many"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_request"
    # The UI's eval page shows the same counts, and links each replay's report.
    web = signed_in_client(rig.server, rig.server.admin_key)
    try:
        page = web.get(f"/evals/{report['id']}")
        assert page.status_code == 200
        assert "7 outputs equal, 3 different, 1 with diverged tool calls" in page.text
        replay_id = report["items"][0]["replay_run_id"]
        assert web.get(f"/replays/{replay_id}").status_code == 200
        # The worker's page starts an eval of each version (what the UI retells
        # `floom eval lookup --against VERSION` as).
        worker_page = web.get("/workers/lookup").text
        assert re.search(
            r'<form method="post" action="/workers/lookup/evals"[^>]*>\s*<input type="hidden" '
            rf'name="csrf"[^>]*><input type="hidden" name="version_id" value="{v2}">',
            worker_page,
        ), worker_page
    finally:
        web.close()


def test_a_deploy_gated_by_a_failing_eval_is_refused_and_accepted_with_the_override(
    rig: AgentRig, tmp_path: Path
) -> None:
    active = rig.api.get("/api/v1/workers/lookup").json()["active_version_id"]
    gate = "replay:\n  gate: {runs: 3, max_different: 0}\n"
    folder = agent_worker(tmp_path / "v3", LOOKUP_YML + gate, skill="Guess.")
    # Two gated deploys, each replaying three runs of two model turns.
    rig.model.script(
        *[agent(lambda i: {"answer": "guess", "score": 0}, lambda i: rig.url(f"/{i}"))] * 12
    )

    refused = deploy(rig.api, folder)

    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "eval_gate_failed"
    assert "`POST /api/v1/workers?skip_eval_gate=true`" in error["hint"]
    assert "floom" not in error["hint"]
    assert error["details"]["totals"]["outputs_different"] == 3
    assert rig.api.get("/api/v1/workers/lookup").json()["active_version_id"] == active
    version = error["details"]["version_id"]

    async def over_mcp() -> None:
        async with http_client(rig.server) as mcp:
            files = worker_files(folder)
            told = await call_error(mcp, "deploy_worker", files=files)
            assert told["code"] == "eval_gate_failed"
            # The hint names the tool and argument that override the gate, nothing else.
            assert "deploy_worker(files={...}, skip_eval_gate=True)" in told["hint"]
            assert f"eval_worker(worker='lookup', version_id='{version}')" in told["hint"]
            assert "--" not in told["hint"]
            assert "/api/v1" not in told["hint"]
            assert "floom " not in told["hint"]
            accepted = await call(mcp, "deploy_worker", files=files, skip_eval_gate=True)
            assert accepted["version"]["id"] == version
            assert accepted["activated"]

    anyio.run(over_mcp)
    assert rig.api.get("/api/v1/workers/lookup").json()["active_version_id"] == version
