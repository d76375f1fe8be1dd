"""Handoffs through the live server: REST with agent keys, the server's lease reaper, and the
`floom agents/roles/handoffs` commands as subprocesses."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.cli import cli
from tests.support.harness import LiveServer, wait_until

JOBS = "/api/v1/handoffs/jobs"


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _setup(server: LiveServer, api: httpx.Client) -> dict[str, httpx.Client]:
    for name in ("coder", "reviewer"):
        _ok(api.post("/api/v1/roles", json={"name": name}), 201)
    clients = {}
    for label, role in (("alice", "coder"), ("bob", "reviewer")):
        body = _ok(api.post("/api/v1/agents", json={"label": label, "roles": [role]}), 201)
        assert body["key"].startswith("flm_")
        assert body["roles"] == [role]
        clients[label] = server.client(body["key"])
    return clients


def test_two_agents_hand_work_over_through_rest_with_their_own_keys(
    server: LiveServer, api: httpx.Client
) -> None:
    agents = _setup(server, api)
    alice, bob = agents["alice"], agents["bob"]
    assert _ok(alice.get("/api/v1/handoffs/me"))["roles"] == ["coder"]
    spec = {
        "summary": "implement the parser",
        "role": "coder",
        "context": {"file": "parser.py"},
        "constraints": ["stdlib only"],
        "routing": [{"role": "reviewer", "summary": "review the parser"}],
        "idempotency_key": "PARSER-1",
    }
    job = _ok(bob.post(JOBS, json=spec), 201)
    again = _ok(bob.post(JOBS, json=spec), 200)
    assert again["id"] == job["id"]
    assert again["replayed"] is True

    assert _ok(bob.post("/api/v1/handoffs/claim-next", json={}))["job"] is None
    claimed = _ok(alice.post("/api/v1/handoffs/claim-next", json={}))["job"]
    assert claimed["id"] == job["id"]
    assert claimed["assignee"]["label"] == "alice"
    _ok(alice.post(f"{JOBS}/{job['id']}/heartbeat", json={"lease_seconds": 120}))
    result = {"summary": "done", "data": {"lines": 120}, "artifacts": []}
    assert _ok(alice.post(f"{JOBS}/{job['id']}/complete", json=result))["status"] == "completed"

    review_job = _ok(bob.post("/api/v1/handoffs/claim-next", json={"role": "reviewer"}))["job"]
    assert review_job["follow_on_of"] == job["id"]
    retry = _ok(bob.post(f"{JOBS}/{job['id']}/reject", json={"reason": "no tests"}), 201)
    assert retry["retry_of"] == job["id"]
    reopen = _ok(alice.get(f"{JOBS}/{retry['id']}/reopen-context"))
    assert reopen["attempt"] == 2
    assert reopen["rejections"][0]["reason"] == "no tests"

    shown = _ok(alice.get(f"{JOBS}/{job['id']}", params={"events": True}))
    assert [e["type"] for e in shown["events"]] == [
        "created",
        "claimed",
        "completed",
        "routed",
        "rejected",
    ]
    listed = _ok(alice.get(JOBS, params={"status": "published,in_progress"}))
    assert [j["id"] for j in listed["items"]] == [retry["id"]]
    everything = _ok(api.get(JOBS))
    assert len(everything["items"]) == 3  # admins see all


def test_refusals_come_in_floom_s_error_shape_and_change_nothing(
    server: LiveServer, api: httpx.Client
) -> None:
    agents = _setup(server, api)
    alice, bob = agents["alice"], agents["bob"]
    job = _ok(bob.post(JOBS, json={"summary": "x", "role": "coder"}), 201)

    not_held = bob.post(f"{JOBS}/{job['id']}/status", json={"status": "completed"})
    assert not_held.status_code == 409
    assert not_held.json()["error"]["code"] == "not_holder"
    cancel = alice.post(f"{JOBS}/{job['id']}/status", json={"status": "cancelled"})
    assert cancel.status_code == 403  # holding the role is not enough to cancel
    wrong = alice.post(f"{JOBS}/{job['id']}/status", json={"status": "blocked"})
    assert wrong.status_code == 409
    error = wrong.json()["error"]
    assert error["code"] == "illegal_transition"
    assert error["details"]["allowed"] == ["in_progress", "cancelled"]
    assert error["hint"]

    assert alice.post("/api/v1/roles", json={"name": "boss"}).status_code == 403
    reserved = api.post("/api/v1/agents", json={"label": "worker:critic", "roles": []})
    assert reserved.status_code == 400  # floom's own agents for workers' handoff triggers
    plain = _ok(api.post("/api/v1/keys", json={"scopes": ["run"]}), 201)["key"]
    with server.client(plain) as outsider:
        refused = outsider.post(JOBS, json={"summary": "x", "role": "coder"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
    reader = _ok(
        api.post("/api/v1/agents", json={"label": "ro", "roles": ["coder"], "scopes": ["read"]}),
        201,
    )
    with server.client(reader["key"]) as ro:
        assert [j["id"] for j in _ok(ro.get(JOBS))["items"]] == [job["id"]]
        assert ro.post(f"{JOBS}/{job['id']}/claim", json={}).status_code == 403
    missing = alice.get(f"{JOBS}/job_nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert _ok(api.get(f"{JOBS}/{job['id']}", params={"events": True}))["status"] == "published"
    assert len(_ok(api.get(f"{JOBS}/{job['id']}/events"))["items"]) == 1


def test_the_server_returns_a_job_whose_lease_expired(
    server: LiveServer, api: httpx.Client
) -> None:
    alice = _setup(server, api)["alice"]
    job = _ok(alice.post(JOBS, json={"summary": "x", "role": "coder"}), 201)
    _ok(alice.post(f"{JOBS}/{job['id']}/claim", json={"lease_seconds": 0.3}))

    def returned() -> dict[str, Any] | None:
        body = _ok(alice.get(f"{JOBS}/{job['id']}", params={"events": True}))
        return body if body["status"] == "published" else None

    body = wait_until(returned, timeout=20)
    assert body["events"][-1]["type"] == "lease_expired"
    assert body["assignee"] is None


# The CLI is a client of the REST API tested above on both databases; one is enough here.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_cli_creates_an_agent_prints_its_key_once_and_drives_a_job(
    server: LiveServer,
) -> None:
    made = cli(server, "roles", "create", "writer", "--description", "writes docs")
    assert made.returncode == 0, made.stderr
    created = cli(
        server, "agents", "create", "scribe", "--role", "writer", "--tool-family", "codex"
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("flm_")
    assert "not be shown again" in created.stderr
    listed = cli(server, "agents", "list")
    assert "scribe" in listed.stdout
    assert key not in listed.stdout

    published = cli(
        server,
        "handoffs", "create", "document the API", "--role", "writer",
        "--context", '{"module": "floom.api"}', "--constraint", "plain English",
        key=key,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    job_id = published.stdout.strip()
    claimed = cli(server, "handoffs", "claim-next", "--json", key=key)
    assert json.loads(claimed.stdout)["id"] == job_id
    done = cli(server, "handoffs", "complete", job_id, "--summary", "written", key=key)
    assert done.returncode == 0
    assert "completed" in done.stdout
    shown = cli(server, "handoffs", "show", job_id, key=key)
    assert "completed" in shown.stdout
    assert "claimed" in shown.stdout
    bad = cli(server, "handoffs", "status", job_id, "in_progress", key=key)
    assert bad.returncode == 1
    assert "error:" in bad.stderr
    assert "hint:" in bad.stderr
