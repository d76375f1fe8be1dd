"""The repo-triage example agent runs as shipped: it reads issues through http_request, writes
a report, and labels an issue only after a person approves the call."""

from __future__ import annotations

import json
from pathlib import Path

from tests.standins.anthropic_api import reply, text, tool_use
from tests.standins.github import github_standin
from tests.support.harness import EXAMPLES
from tests.support.rigs.agents import agent_rig, log_lines, start_run, wait_status

TOKEN = "ghp_triage_token_123"


def test_repo_triage_labels_an_issue_after_approval_and_reports(
    tmp_path: Path, database_url: str
) -> None:
    with (
        github_standin(TOKEN) as gh,
        agent_rig(
            tmp_path / "data", database_url, agent_http_resolve="api.github.com=127.0.0.1"
        ) as rig,
    ):
        rig.deploy(EXAMPLES / "repo-triage")
        rig.api.put("/api/v1/secrets/GITHUB_TOKEN", json={"value": TOKEN})
        gh_port, write_port = gh["url"].rsplit(":", 1)[1], rig.echo["port"]
        auth = {"Authorization": "Bearer ${GITHUB_TOKEN}", "Accept": "application/vnd.github+json"}
        rig.model.script(
            reply(
                text("Fetching the issues."),
                tool_use(
                    "http_request",
                    {
                        "method": "GET",
                        "headers": auth,
                        "url": f"http://api.github.com:{gh_port}/repos/acme/api/issues?state=open",
                    },
                ),
            ),
            reply(
                tool_use("write_file", {"path": "triage.md", "content": "#1 Bug -> bug (crash)"}),
                tool_use(
                    "github_write",
                    {
                        "method": "POST",
                        "headers": auth,
                        "json": {"labels": ["bug"]},
                        "url": f"http://api.github.com:{write_port}/repos/acme/api/issues/1/labels",
                    },
                ),
            ),
        )
        run_id = start_run(rig.api, "repo-triage", {"repo": "acme/api"})
        paused = wait_status(rig.api, run_id, {"awaiting_approval"})
        assert paused["approvals"][0]["tool"] == "github_write"
        assert rig.echo["requests"] == []
        rig.model.script(
            reply(
                tool_use("finish", {"outputs": {"summary": "Labelled #1 as a bug.", "triaged": 1}})
            )
        )
        rig.api.post(f"/api/v1/approvals/{paused['approvals'][0]['id']}/approve", json={})
        run = wait_status(rig.api, run_id)
        logs = log_lines(rig.api, run_id)

    assert run["status"] == "succeeded", (run, logs)
    assert run["outputs"] == {"summary": "Labelled #1 as a bug.", "triaged": 1}
    assert [a["name"] for a in run["artifacts"]] == ["triage.md"]
    assert [c["tool"] for c in run["tool_calls"]] == [
        "http_request",
        "write_file",
        "github_write",
        "finish",
    ]
    assert {auth for _, auth in gh["requests"]} == {f"Bearer {TOKEN}"}
    (labelled,) = rig.echo["requests"]
    assert labelled["method"] == "POST"
    assert json.loads(labelled["body"]) == {"labels": ["bug"]}
    assert labelled["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert rig.model.tool_names(0) == ["http_request", "github_write", "write_file", "finish"]
    assert TOKEN not in json.dumps(run)


def test_the_examples_deployed_at_first_start_include_the_agent(
    tmp_path: Path, database_url: str
) -> None:
    from tests.support.harness import live_server

    with (
        live_server(tmp_path / "data", database_url, deploy_examples=True) as srv,
        srv.client() as api,
    ):
        names = [w["name"] for w in api.get("/api/v1/workers").json()["items"]]
        worker = api.get("/api/v1/workers/repo-triage").json()

    assert {"hello", "repo-triage"} <= set(names)
    assert worker["kind"] == "agent"
