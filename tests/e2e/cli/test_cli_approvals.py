"""`floom approvals`, `floom approve`, `floom reject` and the agent part of `floom show`, run
as subprocesses against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.api.test_approvals import MAILER_PY, MAILER_YML
from tests.standins.anthropic_api import reply, tool_use
from tests.support.harness import LiveServer, deploy_folder, make_worker
from tests.support.rigs.agents import agent_rig, agent_worker, start_run, wait_status


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """The CLI is a client of the REST API: one database kind is enough here."""
    return f"sqlite:///{tmp_path / 'floom.db'}"


def floom(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=server.cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _gated_run(api: httpx.Client, tmp_path: Path) -> tuple[str, str]:
    deploy_folder(api, make_worker(tmp_path / "mailer", MAILER_YML, {"run.py": MAILER_PY}))
    api.put("/api/v1/secrets/DRAFT_TOKEN", json={"value": "draft-token-1"})
    api.put("/api/v1/secrets/SMTP_PASSWORD", json={"value": "smtp-pass-1"})
    run_id = start_run(api, "mailer")
    approval_id: str = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]
    return run_id, approval_id


def test_approvals_are_listed_and_approved_with_edits_from_the_command_line(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    run_id, approval_id = _gated_run(api, tmp_path)

    listed = floom(server, "approvals")
    assert listed.returncode == 0
    assert approval_id in listed.stdout
    assert "run outputs" in listed.stdout
    assert "floom approve ID" in listed.stdout
    as_json: dict[str, Any] = json.loads(floom(server, "approvals", "--json").stdout)
    assert [a["id"] for a in as_json["items"]] == [approval_id]

    bad = floom(server, "approve", approval_id, "--edit", "[1]")
    assert bad.returncode != 0
    assert "JSON object" in bad.stderr
    done = floom(
        server, "approve", approval_id, "--edit", '{"subject": "Hello"}', "--comment", "ok"
    )
    assert done.returncode == 0, done.stderr
    assert f"approved {approval_id}" in done.stdout
    assert run_id in done.stdout
    assert wait_status(api, run_id)["outputs"]["subject"] == "Hello"
    again = floom(server, "approve", approval_id)
    assert again.returncode == 1
    assert "already approved" in again.stderr
    assert "nothing awaits approval" in floom(server, "approvals").stdout


def test_a_rejection_from_the_command_line_needs_a_comment(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    run_id, approval_id = _gated_run(api, tmp_path)

    missing = floom(server, "reject", approval_id)
    assert missing.returncode == 2
    assert "--comment" in missing.stderr
    done = floom(server, "reject", approval_id, "--comment", "not today")

    assert done.returncode == 0, done.stderr
    assert "rejected" in done.stdout
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "rejected"


def test_show_prints_an_agent_runs_tool_calls_usage_and_approvals(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url) as rig:
        rig.deploy(
            agent_worker(
                tmp_path / "keeper",
                "name: keeper\ntools: [{builtin: remember}, {builtin: request_approval}]\n",
            )
        )
        rig.model.script(
            reply(
                tool_use("remember", {"key": "k", "value": 1}),
                tool_use("request_approval", {"question": "ok?"}),
            )
        )
        run_id = start_run(rig.api, "keeper")
        wait_status(rig.api, run_id, {"awaiting_approval"})
        shown = floom(rig.server, "show", run_id)

    assert shown.returncode == 0, shown.stderr
    assert "awaiting_approval" in shown.stdout
    assert "tool calls:" in shown.stdout
    assert "remember" in shown.stdout
    assert "request_approval" in shown.stdout
    assert "model: claude-sonnet-4-5, 1 turn, 100 in + 20 out tokens" in shown.stdout
    assert "approval apr_" in shown.stdout
    assert "pending" in shown.stdout


def test_run_wait_shows_the_agents_tool_calls_as_they_happen(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url) as rig:
        rig.deploy(
            agent_worker(tmp_path / "keeper", "name: keeper\ntools: [{builtin: remember}]\n")
        )
        rig.model.script(
            reply(tool_use("remember", {"key": "k", "value": 1})),
            reply(tool_use("finish", {"outputs": {"note": "done"}})),
        )
        waited = floom(rig.server, "run", "keeper", "--wait")

    assert waited.returncode == 0, waited.stderr
    assert 'tool remember {"key": "k", "value": 1} -> ok' in waited.stdout
    assert "succeeded" in waited.stdout
    assert "note: done" in waited.stdout
