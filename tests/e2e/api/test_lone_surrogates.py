"""A JSON body holding a lone UTF-16 surrogate (`"\\ud800"`, no character) is refused with a
400 naming where, on every route and in a signed webhook's body; Python's parser takes it,
and the first encoding of it (a size check, the database) answered 500. A pair of escapes
(one character) is taken as it always was."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import httpx
import pytest

from floom.store.db import session_scope
from floom.store.models import Run
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

LONE = '"x\\ud800"'
HOOK_SECRET = "gh-hook-secret-123"

# (method, path, body with {s} where a lone surrogate goes): free text and JSON values that
# no field rule looked at before the database or a size check did.
BODIES = [
    ("POST", "/api/v1/workers/w/runs", '{"inputs": {"a": %s}}'),
    ("POST", "/api/v1/workers/w/runs", '{"inputs": {"a": ["ok", {"deep": %s}]}}'),
    ("PUT", "/api/v1/workers/w/state", '{"state": {"k": %s}}'),
    ("PUT", "/api/v1/secrets/LONE_SECRET", '{"value": %s}'),
    ("POST", "/api/v1/roles", '{"name": "lone", "description": %s}'),
    ("POST", "/api/v1/agents", '{"label": %s}'),
    ("POST", "/api/v1/keys", '{"scopes": ["read"], "name": %s}'),
    ("POST", "/api/v1/handoffs/jobs", '{"summary": "s", "role": "r", "context": {"c": %s}}'),
]


@pytest.fixture
def deployed(api: httpx.Client, tmp_path: Path) -> None:
    manifest = (
        "name: w\ninputs:\n  a: {type: string, default: x}\n  event: {type: object, default: {}}\n"
        "state: {}\ntriggers:\n  - webhook: {signature: github, secret: LONE_HOOK}\n"
    )
    api.put("/api/v1/secrets/LONE_HOOK", json={"value": HOOK_SECRET})
    deploy_folder(api, make_worker(tmp_path / "w", manifest, {"run.py": "print(1)\n"}))


@pytest.mark.usefixtures("deployed")
def test_a_lone_surrogate_in_a_json_body_is_a_400_naming_where_and_nothing_changes(
    server: LiveServer, api: httpx.Client
) -> None:
    before = {
        path: api.get(path).json()
        for path in ("/api/v1/runs", "/api/v1/secrets", "/api/v1/roles", "/api/v1/keys")
    }
    for method, path, body in BODIES:
        for lone in (LONE, '"\\udc00"', '"a\\ud800\\ud800"'):
            resp = api.request(
                method, path, content=body % lone, headers={"content-type": "application/json"}
            )
            assert resp.status_code == 400, (path, body, resp.status_code, resp.text[:300])
            error = resp.json()["error"]
            assert error["code"] == "invalid_request", error
            assert "lone UTF-16 surrogate at body." in error["message"], error
    for path, seen in before.items():
        assert api.get(path).json() == seen, path
    # One character written as a pair of escapes is text like any other.
    paired = '{"inputs": {"a": "\\ud83d\\ude00"}}'
    resp = api.post(
        "/api/v1/workers/w/runs", content=paired, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 202, resp.text
    assert resp.json()["inputs"]["a"] == "\U0001f600"


@pytest.mark.usefixtures("deployed")
def test_a_signed_webhook_body_with_a_lone_surrogate_is_never_a_500(
    server: LiveServer, api: httpx.Client
) -> None:
    for body in (b'{"a": "\\ud800"}', b'{"a": "\xed\xa0\x80"}'):
        mac = hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers = {
            "X-Hub-Signature-256": f"sha256={mac}",
            "X-GitHub-Delivery": hashlib.sha256(body).hexdigest(),
            "X-GitHub-Event": "push",
            "Content-Type": "application/json",
        }
        with httpx.Client(base_url=server.base_url, timeout=60) as anonymous:
            resp = anonymous.post("/hooks/w", content=body, headers=headers)
        assert resp.status_code < 500, (body, resp.status_code, resp.text[:300])
    for run in api.get("/api/v1/runs", params={"worker": "w"}).json()["items"]:
        assert api.get(f"/api/v1/runs/{run['id']}").status_code == 200
    deliveries = api.get("/api/v1/workers/w/deliveries")
    assert deliveries.status_code == 200, deliveries.text[:300]


WRITES_LONE = """\
open("result.json", "w").write('{"outputs": {"a": "x\\\\ud800"}}')
"""


def test_a_result_with_a_lone_surrogate_fails_the_run_and_a_stored_one_reads_as_u_fffd(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    manifest = "name: lone\noutputs:\n  a: {type: string}\n"
    deploy_folder(api, make_worker(tmp_path / "lone", manifest, {"run.py": WRITES_LONE}))
    run = wait_for_run(api, api.post("/api/v1/workers/lone/runs", json={}).json()["id"])
    assert run["status"] == "failed", run
    assert run["error"]["code"] == "result_invalid", run["error"]
    assert "surrogate" in run["error"]["message"], run["error"]
    # A row stored before floom refused them (or written by hand) is shown, never a 500.
    with session_scope(server.ctx.engine, write=True) as s:
        row = s.get(Run, run["id"])
        assert row is not None
        row.outputs_json = '{"a": "x\\ud800", "\\udc00": ["\\ud83d\\ude00"]}'
        s.add(row)
    shown = api.get(f"/api/v1/runs/{run['id']}")
    assert shown.status_code == 200, shown.text[:300]
    assert shown.json()["outputs"] == {"a": "x\ufffd", "\ufffd": ["\U0001f600"]}
    assert api.get("/api/v1/runs", params={"worker": "lone"}).status_code == 200
