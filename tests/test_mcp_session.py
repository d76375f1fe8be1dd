"""An agent's whole session through `floom mcp` (stdio) alone: deploy, run, logs, a failed run,
replay, rollback and an approval."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio

from tests.conftest import EXAMPLES, LiveServer, make_worker
from tests.mcp_support import call, stdio_client

BROKEN_RUN_PY = """\
import sys
print("calling the greeting service", flush=True)
sys.exit("boom: the greeting service is down")
"""
GATED_YML = """\
name: publish
outputs:
  title: {type: string, required: true}
approvals: {required: true}
"""
GATED_PY = """\
import json, os
if os.environ["FLOOM_PHASE"] == "propose":
    json.dump({"outputs": {"title": "Draft title"}}, open("result.json", "w"))
else:
    decision = json.load(open("decision.json"))
    print("publishing", decision["outputs"]["title"], flush=True)
"""


def test_an_agent_deploys_runs_debugs_replays_rolls_back_and_approves_over_mcp(
    server: LiveServer, tmp_path: Path
) -> None:
    broken = tmp_path / "hello-broken"
    shutil.copytree(EXAMPLES / "hello", broken)
    (broken / "run.py").write_text(BROKEN_RUN_PY)
    gated = make_worker(tmp_path / "publish", GATED_YML, {"run.py": GATED_PY})

    async def session() -> None:
        async with stdio_client(server) as mcp:
            # Deploy an example folder and run it.
            first = await call(mcp, "deploy_worker", folder=str(EXAMPLES / "hello"))
            assert first["created"] is True
            v1 = first["version"]["id"]
            ran = await call(
                mcp, "run_worker", worker="hello", inputs={"name": "Ada"}, wait_seconds=30
            )
            assert ran["finished"] is True
            assert ran["run"]["outputs"] == {"greeting": "Hello, Ada!", "length": 11}
            logs = await call(mcp, "get_run_logs", run_id=ran["run"]["id"])
            assert ("stdout", "Hello, Ada!") in [(e["stream"], e["line"]) for e in logs["items"]]

            # A new version breaks; the agent finds the failed run and reads why.
            second = await call(mcp, "deploy_worker", folder=str(broken))
            v2 = second["version"]["id"]
            assert v2 != v1
            started = await call(mcp, "run_worker", worker="hello", inputs={"name": "Bob"})
            watched = await call(mcp, "watch_run", run_id=started["run"]["id"], timeout_seconds=30)
            assert watched["finished"] is True and watched["run"]["status"] == "failed"
            failed = await call(mcp, "list_runs", worker="hello", status="failed")
            failed_id = failed["items"][0]["id"]
            assert failed_id == started["run"]["id"]
            detail = await call(mcp, "get_run", run_id=failed_id)
            assert detail["status"] == "failed" and detail["version_id"] == v2
            assert detail["tool_calls"] == [] and detail["approvals"] == []
            tail = await call(mcp, "get_run_logs", run_id=failed_id, tail=50)
            assert any("greeting service is down" in e["line"] for e in tail["items"])

            # Replaying on the same version fails again; after a rollback it succeeds.
            # replay_run waits for the end as run_worker does.
            replay = await call(mcp, "replay_run", run_id=failed_id, wait_seconds=30)
            assert replay["finished"] is True and replay["run"]["status"] == "failed"
            assert replay["run"]["replay_of"] == failed_id and replay["run"]["version_id"] == v2
            rolled = await call(mcp, "rollback_worker", worker="hello", version_id=v1)
            assert rolled["version"]["id"] == v1 and rolled["changed"] is True
            # Rolling back to the active version again is a quiet success.
            same = await call(mcp, "rollback_worker", worker="hello", version_id=v1)
            assert same["changed"] is False
            versions = await call(mcp, "list_versions", worker="hello")
            assert [v["id"] for v in versions["items"] if v["active"]] == [v1]
            fixed = await call(mcp, "replay_run", run_id=failed_id, latest=True, wait_seconds=30)
            assert fixed["run"]["status"] == "succeeded"
            assert fixed["run"]["outputs"]["greeting"] == "Hello, Bob!"
            lineage = (await call(mcp, "get_run", run_id=fixed["run"]["id"]))["lineage"]
            assert lineage["replay_of"] == failed_id

            # A gated worker waits for a person; the agent approves with an edit.
            await call(mcp, "deploy_worker", folder=str(gated))
            proposed = await call(mcp, "run_worker", worker="publish", wait_seconds=30)
            assert proposed["run"]["status"] == "awaiting_approval"
            pending = await call(mcp, "list_approvals", worker="publish")
            (approval,) = pending["items"]
            assert approval["proposed"] == {"title": "Draft title"}
            decided = await call(
                mcp,
                "decide_approval",
                approval_id=approval["id"],
                decision="approve",
                edits={"title": "Final title"},
                comment="ship it",
            )
            assert decided["status"] == "approved"
            applied = await call(mcp, "watch_run", run_id=proposed["run"]["id"], timeout_seconds=30)
            assert applied["run"]["status"] == "succeeded"
            assert applied["run"]["outputs"] == {"title": "Final title"}
            assert any("publishing Final title" in e["line"] for e in applied["logs"])
            final = await call(mcp, "get_run", run_id=proposed["run"]["id"])
            assert [a["status"] for a in final["approvals"]] == ["approved"]

    anyio.run(session)
