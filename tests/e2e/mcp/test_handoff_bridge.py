"""The worker bridge: a worker with `handoff: {role: ...}` claims that role's jobs, runs with
the job's context as inputs, and completes or fails the job with the run's outcome."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_until
from tests.support.mcp_clients import call, http_client
from tests.support.web import signed_in_client

JOBS = "/api/v1/handoffs/jobs"
REVIEWER_YML = """\
name: {name}
inputs:
  text: {{type: string, required: true}}
outputs:
  verdict: {{type: string, required: true}}
  words: {{type: integer}}
triggers:
  - handoff: {{role: {role}}}
limits: {{timeout_seconds: 60}}
"""
REVIEWER_PY = """\
import json, os
from pathlib import Path

text = json.loads(Path("inputs.json").read_text())["text"]
if text == "explode":
    raise SystemExit("cannot review an explosion")
Path(os.environ["FLOOM_OUTPUT_DIR"], "notes.md").write_text("looks fine: " + text)
words = len(text.split())
verdict = "approve" if words < 10 else "reject"
Path("result.json").write_text(json.dumps({"outputs": {"verdict": verdict, "words": words}}))
"""


def _agent_client(server: LiveServer, api: httpx.Client, label: str) -> httpx.Client:
    made = api.post("/api/v1/agents", json={"label": label, "roles": []})
    assert made.status_code == 201, made.text
    return server.client(made.json()["key"])


def _finished(client: httpx.Client, job_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = client.get(f"{JOBS}/{job_id}", params={"events": True}).json()
    return body if body["status"] in ("completed", "failed") else None


def test_a_worker_with_a_handoff_trigger_takes_its_roles_jobs_and_finishes_them(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    assert api.post("/api/v1/roles", json={"name": "reviewer"}).status_code == 201
    folder = make_worker(
        tmp_path / "critic",
        REVIEWER_YML.format(name="critic", role="reviewer"),
        {"run.py": REVIEWER_PY},
    )
    deploy_folder(api, folder)
    lead = _agent_client(server, api, "lead")
    job = lead.post(
        JOBS,
        json={
            "summary": "review the release notes",
            "role": "reviewer",
            "context": {"text": "ship it today", "ticket": "REL-9"},
            "routing": [
                {"role": "reviewer", "condition": {"path": "data.outputs.verdict", "equals": "x"}}
            ],
        },
    ).json()

    done = wait_until(lambda: _finished(lead, job["id"]), timeout=60)
    assert done["status"] == "completed", done
    assert done["assignee"]["label"] == "worker:critic"
    result = done["result"]
    assert result["data"]["outputs"] == {"verdict": "approve", "words": 3}
    run_id = result["data"]["run_id"]
    assert done["run_id"] == run_id
    (artifact,) = result["artifacts"]
    assert artifact["uri"] == f"/api/v1/runs/{run_id}/artifacts/notes.md"
    assert artifact["checksum"].startswith("sha256:")
    assert lead.get(artifact["uri"]).text == "looks fine: ship it today"
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["trigger"] == "handoff"
    assert run["inputs"] == {"text": "ship it today"}
    assert [e["type"] for e in done["events"]] == [
        "created",
        "claimed",
        "run_started",
        "completed",
        "routing_skipped",
    ]

    bad = lead.post(
        JOBS, json={"summary": "review chaos", "role": "reviewer", "context": {"text": "explode"}}
    ).json()
    failed = wait_until(lambda: _finished(lead, bad["id"]), timeout=60)
    assert failed["status"] == "failed"
    assert "failed" in failed["reason"]
    assert failed["run_id"]

    missing = lead.post(
        JOBS, json={"summary": "no text", "role": "reviewer", "context": {"other": 1}}
    ).json()
    refused = wait_until(lambda: _finished(lead, missing["id"]), timeout=60)
    assert refused["status"] == "failed"
    assert "could not start" in refused["reason"]
    assert refused["run_id"] is None


def test_a_job_failed_by_its_run_tells_each_caller_what_to_do_in_its_own_terms(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # The run fails with a stored error naming `floom secrets set KEEPER_TOKEN`; the job's
    # reason quotes it, and each surface retells it as it does the run's own error.
    assert api.post("/api/v1/roles", json={"name": "keeper"}).status_code == 201
    manifest = REVIEWER_YML.format(name="keeper", role="keeper") + "secrets: [KEEPER_TOKEN]\n"
    deploy_folder(api, make_worker(tmp_path / "keeper", manifest, {"run.py": REVIEWER_PY}))
    made = api.post("/api/v1/agents", json={"label": "lead", "roles": []}).json()
    lead = server.client(made["key"])
    job = lead.post(
        JOBS, json={"summary": "keep it", "role": "keeper", "context": {"text": "hi"}}
    ).json()
    failed = wait_until(lambda: _finished(lead, job["id"]), timeout=60)
    assert failed["status"] == "failed"
    assert "secret KEEPER_TOKEN is not set" in failed["reason"]
    (moved,) = [e for e in failed["events"] if e["type"] == "failed"]

    rest = '`PUT /api/v1/secrets/KEEPER_TOKEN {"value": "VALUE"}`'
    assert rest in failed["reason"]
    assert "floom" not in failed["reason"]
    assert moved["payload"]["reason"] == failed["reason"]
    listed = lead.get(JOBS, params={"status": "failed"}).json()["items"]
    assert [j["reason"] for j in listed] == [failed["reason"]]

    cli = lead.get(f"{JOBS}/{job['id']}", headers={"X-Floom-Client": "cli"}).json()
    assert "`floom secrets set KEEPER_TOKEN`" in cli["reason"]

    async def over_mcp() -> None:
        async with http_client(server, made["key"]) as mcp:
            told = await call(mcp, "handoff_get_job", job_id=job["id"])
            assert "set_secret(name='KEEPER_TOKEN', value=VALUE)" in told["reason"]
            assert "floom" not in told["reason"]
            assert "/api/v1" not in told["reason"]
            (event,) = [e for e in told["events"] if e["type"] == "failed"]
            assert event["payload"]["reason"] == told["reason"]

    anyio.run(over_mcp)

    ui = signed_in_client(server, server.admin_key)
    for page in (f"/handoffs/jobs/{job['id']}", "/handoffs"):
        shown = html.unescape(ui.get(page).text)
        assert "the Secrets page (/secrets), adding KEEPER_TOKEN" in shown, page
        assert "floom secrets" not in shown, page
        assert "/api/v1/secrets" not in shown, page
    ui.close()
