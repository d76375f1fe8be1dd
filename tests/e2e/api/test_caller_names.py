"""Every name a caller gives (a key's name, an agent's label and tool family, a role, a
secret, an alert channel, an alert rule, a worker) holding a control character is refused
with a 400 naming it, and nothing is stored. Before, a key named "a\\x00b" was answered
with the name as sent while "a\\ufffdb" was stored (the store writes a NUL as U+FFFD), and
a secret or role name ending in a newline was stored with it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from floom.bundle import read_folder
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, make_worker

WEBHOOK = {"url": "https://93.184.216.34/hook", "secret": "HOOK_KEY"}
# Controls, and characters that reorder or hide text (one name posing as another).
BAD = ["a\x00b", "a\nb", "ab\n", "a\x1b[2Jb", "a\u2028b", "a\u202eb", "a\u200bb"]


def _listing(api: httpx.Client) -> dict[str, Any]:
    """What the store holds of every kind of name, as the API lists it."""
    return {
        path: api.get(path).json()
        for path in (
            "/api/v1/keys",
            "/api/v1/agents",
            "/api/v1/roles",
            "/api/v1/secrets",
            "/api/v1/alerts/channels",
            "/api/v1/alerts/rules",
            "/api/v1/workers",
        )
    }


def _attempts(api: httpx.Client, bad: str, tmp_path: Path) -> dict[str, httpx.Response]:
    channel = {"kind": "webhook", "config": WEBHOOK}
    agent = {"label": "ok-agent", "roles": []}
    folder = make_worker(tmp_path / "w", f"name: {bad!r}\n".replace("'", '"'), {"run.py": ""})
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    return {
        "key name": api.post("/api/v1/keys", json={"scopes": ["read"], "name": bad}),
        "agent label": api.post("/api/v1/agents", json={**agent, "label": bad}),
        "agent tool_family": api.post("/api/v1/agents", json={**agent, "tool_family": bad}),
        "agent relabelled": api.patch("/api/v1/agents/keeper", json={"label": bad}),
        "role": api.post("/api/v1/roles", json={"name": bad.lower()}),
        "role renamed": api.patch("/api/v1/roles/kept", json={"name": bad.lower()}),
        "secret": api.put(
            "/api/v1/secrets/" + quote(bad.upper(), safe=""),
            json={"value": "a-secret-value-1234"},
        ),
        "channel": api.post("/api/v1/alerts/channels", json={**channel, "name": bad}),
        "rule": api.post(
            "/api/v1/alerts/rules", json={"name": bad, "events": ["*"], "channels": ["ops"]}
        ),
        "worker": api.post(
            "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
        ),
    }


def test_a_name_holding_a_control_character_is_refused_and_nothing_is_stored(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    api.post("/api/v1/roles", json={"name": "kept"}).raise_for_status()
    api.post("/api/v1/agents", json={"label": "keeper", "roles": []}).raise_for_status()
    signing = {"value": "whsec_" + base64.b64encode(b"caller-names-signing-key-0123").decode()}
    api.put("/api/v1/secrets/HOOK_KEY", json=signing).raise_for_status()
    channel = {"name": "ops", "kind": "webhook", "config": WEBHOOK}
    made = api.post("/api/v1/alerts/channels", json=channel)
    assert made.status_code == 201, made.text
    before = _listing(api)
    wrong = []
    for bad in BAD:
        for what, resp in _attempts(api, bad, tmp_path).items():
            body = resp.json()
            if resp.status_code not in (400, 422) or "error" not in body:
                wrong.append(f"{what} {bad!r}: {resp.status_code} {resp.text[:200]}")
    assert wrong == [], "\n".join(wrong)
    assert _listing(api) == before


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_key_name_with_a_nul_is_refused_naming_the_field(server: LiveServer) -> None:
    resp = server.client().post("/api/v1/keys", json={"scopes": ["read"], "name": "a\x00b"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"] == {"field": "name"}
    assert "control character (U+0000)" in error["message"]


def test_a_refusal_quotes_a_caller_s_value_short_whatever_its_length(
    server: LiveServer, api: httpx.Client
) -> None:
    """A status, a priority, a scope, an input's name or a trigger id of 10 KB is refused
    quoting at most a short head of it; before, each refusal answered it back whole (an
    input's name twice), so a request echoed itself at any length."""
    big = "z" * 10_000
    deploy_folder(api, EXAMPLES / "hello")
    assert api.post("/api/v1/roles", json={"name": "coder"}).status_code == 201
    made = api.post("/api/v1/agents", json={"label": "alice", "roles": ["coder"]}).json()
    alice = server.client(made["key"])
    jobs = "/api/v1/handoffs/jobs"
    run = api.post("/api/v1/workers/hello/runs", json={}).json()
    job = alice.post(jobs, json={"summary": "s", "role": "coder"}).json()
    assert alice.post(f"{jobs}/{job['id']}/claim", json={}).status_code == 200
    tries: list[tuple[httpx.Client, str, str, dict[str, Any]]] = [
        (alice, "POST", f"{jobs}/{job['id']}/status", {"status": big}),
        (alice, "POST", jobs, {"summary": "s", "role": "coder", "priority": big}),
        (api, "POST", "/api/v1/keys", {"scopes": [big]}),
        (api, "POST", "/api/v1/agents", {"label": "bob", "scopes": [big]}),
        (api, "POST", "/api/v1/workers/hello/runs", {"inputs": {big: 1}}),
        (api, "POST", "/api/v1/workers/hello/pause", {"trigger_id": big}),
        (alice, "POST", "/api/v1/handoffs/claim-next", {"role": big}),
        (api, "GET", f"/api/v1/runs/{run['id']}/artifacts/{big}", {}),
    ]
    wrong = []
    for client, method, url, body in tries:
        resp = client.request(method, url, json=body)
        if resp.status_code not in (400, 403, 404, 422) or len(resp.content) > 1_000:
            wrong.append(
                f"{method} {url[:80]} {list(body)}: {resp.status_code}, {len(resp.content)} B"
            )
    assert wrong == [], "\n".join(wrong)
