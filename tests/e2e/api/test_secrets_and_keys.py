"""Secrets stay secret and API keys gate every route, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import httpx

from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import ApiKey, Secret, Version
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

LEAKY = """\
import json, os
from pathlib import Path
token = os.environ.get("API_TOKEN", "")
print("token is", token)
print("undeclared is", os.environ.get("OTHER_TOKEN"))
Path(os.environ["FLOOM_OUTPUT_DIR"], "t.txt").write_text(token)
Path("result.json").write_text(json.dumps({"outputs": {"echo": "x" + token + "x"}}))
"""


def _leaky_worker(api: httpx.Client, tmp_path: Path) -> None:
    folder = make_worker(
        tmp_path / "leaky", "name: leaky\nsecrets: [API_TOKEN]\n", {"run.py": LEAKY}
    )
    deploy_folder(api, folder)


def test_a_declared_secret_reaches_the_script_but_is_redacted_everywhere_stored(
    api: httpx.Client, tmp_path: Path
) -> None:
    _leaky_worker(api, tmp_path)
    assert api.put("/api/v1/secrets/API_TOKEN", json={"value": "s3cr3t-value"}).status_code == 200
    assert api.put("/api/v1/secrets/OTHER_TOKEN", json={"value": "other-value"}).status_code == 200
    run = wait_for_run(api, api.post("/api/v1/workers/leaky/runs", json={}).json()["id"])
    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"echo": "x***x"}
    lines = [e["line"] for e in api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]]
    assert "token is ***" in lines
    assert "undeclared is None" in lines
    assert not any("s3cr3t-value" in line for line in lines)
    # The script did receive the real value; a text artifact is stored redacted.
    assert api.get(f"/api/v1/runs/{run['id']}/artifacts/t.txt").text == "***"


def test_secret_values_are_never_returned_and_are_encrypted_at_rest(
    server: LiveServer, api: httpx.Client
) -> None:
    api.put("/api/v1/secrets/GITHUB_TOKEN", json={"value": "ghp_plaintextvalue"})
    listed = api.get("/api/v1/secrets")
    assert [s["name"] for s in listed.json()["items"]] == ["GITHUB_TOKEN"]
    assert "ghp_plaintextvalue" not in listed.text
    with session_scope(server.ctx.engine) as s:
        row = s.get(Secret, "GITHUB_TOKEN")
        assert row is not None
        assert b"ghp_plaintextvalue" not in row.ciphertext
    assert api.delete("/api/v1/secrets/GITHUB_TOKEN").status_code == 200
    assert api.get("/api/v1/secrets").json()["items"] == []
    gone = api.delete("/api/v1/secrets/GITHUB_TOKEN")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "not_found"


def test_a_run_whose_declared_secret_is_missing_fails_before_start_naming_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    _leaky_worker(api, tmp_path)
    run = wait_for_run(api, api.post("/api/v1/workers/leaky/runs", json={}).json()["id"])
    assert run["status"] == "failed"
    assert run["error"]["code"] == "secret_missing"
    assert "API_TOKEN" in run["error"]["message"]
    assert "`PUT /api/v1/secrets/API_TOKEN" in run["error"]["message"]
    stdout = [
        e
        for e in api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]
        if e["stream"] == "stdout"
    ]
    assert stdout == []


def test_a_bad_secret_name_is_refused_with_a_hint(api: httpx.Client) -> None:
    resp = api.put("/api/v1/secrets/not-valid", json={"value": "abcdef"})
    assert resp.status_code == 400
    body = resp.json()["error"]
    assert body["code"] == "invalid_request"
    assert body["hint"]


def test_every_route_needs_a_key(server: LiveServer) -> None:
    with server.client(key="") as anon:
        for method, path in [
            ("GET", "/api/v1/workers"),
            ("GET", "/api/v1/runs"),
            ("POST", "/api/v1/workers/hello/runs"),
            ("GET", "/api/v1/secrets"),
            ("GET", "/api/v1/keys"),
            ("POST", "/api/v1/workers"),
        ]:
            resp = anon.request(method, path)
            assert resp.status_code == 401, (method, path)
            assert resp.json()["error"]["code"] == "unauthorized"
    with server.client(key="flm_wrong") as wrong:
        assert wrong.get("/api/v1/workers").status_code == 401


def test_scopes_limit_what_a_key_can_do(server: LiveServer, api: httpx.Client) -> None:
    read_key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]
    run_key = api.post("/api/v1/keys", json={"scopes": ["run"]}).json()["key"]
    with server.client(key=read_key) as reader:
        assert reader.get("/api/v1/runs").status_code == 200
        refused = reader.post("/api/v1/workers/hello/runs", json={})
        assert refused.status_code == 403
        assert "'run'" in refused.json()["error"]["message"]
    with server.client(key=run_key) as runner:
        assert runner.get("/api/v1/runs").status_code == 200
        assert runner.post("/api/v1/workers", content=b"x").status_code == 403
        assert runner.get("/api/v1/secrets").status_code == 403


def test_keys_are_stored_hashed_shown_once_and_revocable(
    server: LiveServer, api: httpx.Client
) -> None:
    created = api.post("/api/v1/keys", json={"scopes": ["read"], "name": "ci"})
    assert created.status_code == 201
    token = created.json()["key"]
    listed = api.get("/api/v1/keys").text
    assert token not in listed
    with session_scope(server.ctx.engine) as s:
        row = s.get(ApiKey, created.json()["id"])
        assert row is not None
        assert token not in row.key_hash
    with server.client(key=token) as c:
        assert c.get("/api/v1/workers").status_code == 200
        assert api.delete(f"/api/v1/keys/{created.json()['id']}").status_code == 200
        assert c.get("/api/v1/workers").status_code == 401


def test_unknown_scope_is_refused(api: httpx.Client) -> None:
    resp = api.post("/api/v1/keys", json={"scopes": ["superuser"]})
    assert resp.status_code == 400
    assert "read, run, deploy, admin" in resp.json()["error"]["hint"]


def test_a_secret_name_that_changes_how_programs_load_or_run_is_refused_saying_why(
    server: LiveServer, api: httpx.Client
) -> None:
    for name, why in [
        ("LD_PRELOAD", "dynamic loader"),
        ("PYTHONPATH", "Python"),
        ("PATH", "floom sets it"),
        ("FLOOM_TOKEN", "FLOOM_*"),
        ("NODE_OPTIONS", "Node.js"),
    ]:
        resp = api.put(f"/api/v1/secrets/{name}", json={"value": "/work/lib.so"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "secret_name_refused"
        assert why in error["message"]
        assert "LD_*" in error["hint"]
    with session_scope(server.ctx.engine) as s:
        assert s.get(Secret, "LD_PRELOAD") is None


def test_a_secret_stored_under_a_refused_name_before_the_rule_never_reaches_a_run(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # A worker deployed and a secret stored before names like LD_PRELOAD were refused:
    # both written straight into the store, past today's checks.
    folder = make_worker(
        tmp_path / "old", "name: old\nsecrets: [SAFE_TOKEN]\n", {"run.py": "print('ran')\n"}
    )
    version_id = deploy_folder(api, folder)["version"]["id"]
    with session_scope(server.ctx.engine, write=True) as s:
        version = s.get(Version, version_id)
        assert version is not None
        version.manifest_json = version.manifest_json.replace("SAFE_TOKEN", "LD_PRELOAD")
        s.add(version)
        s.add(Secret(name="LD_PRELOAD", ciphertext=server.ctx.secret_box.encrypt("/x/lib.so")))
    workers.forget_versions([version_id])  # as read by a node started after the change

    run = wait_for_run(api, api.post("/api/v1/workers/old/runs", json={}).json()["id"])

    assert run["status"] == "failed"
    assert run["error"]["code"] == "secret_name_refused", run["error"]
    assert "LD_PRELOAD" in run["error"]["message"]
    assert "Rename it" in run["error"]["message"]
    lines = [e["line"] for e in api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]]
    assert "ran" not in lines


def test_a_secret_too_long_for_any_process_environment_is_refused_when_set(
    api: httpx.Client,
) -> None:
    resp = api.put("/api/v1/secrets/BIG_TOKEN", json={"value": "x" * (200 * 1024)})

    assert resp.status_code == 400, resp.text
    assert "environment variable" in resp.json()["error"]["message"]
    assert api.get("/api/v1/secrets").json()["items"] == []


NUMERIC = """\
import json, os
pin = os.environ["CARD_NUMBER"]
state = {"card": int(pin), "cards": [int(pin) * 10, float(pin)], "keep": 7}
outputs = {"card": int(pin), "as_float": float(pin), "other": 7, "flag": True}
open("result.json", "w").write(json.dumps({"outputs": outputs, "state": state}))
"""


def test_a_secret_of_digits_written_as_a_json_number_is_redacted_in_outputs_and_state(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Written as a number, not a string, a secret's digits are still the stored JSON's bytes.
    folder = make_worker(
        tmp_path / "numeric",
        "name: numeric\nsecrets: [CARD_NUMBER]\nstate: true\n",
        {"run.py": NUMERIC},
    )
    deploy_folder(api, folder)
    value = "4242424242424242"
    assert api.put("/api/v1/secrets/CARD_NUMBER", json={"value": value}).status_code == 200
    run = wait_for_run(api, api.post("/api/v1/workers/numeric/runs", json={}).json()["id"])
    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"card": "***", "as_float": "***", "other": 7, "flag": True}
    state = api.get("/api/v1/workers/numeric/state")
    assert state.status_code == 200, state.text
    assert value not in state.text
    assert state.json()["state"] == {"card": "***", "cards": ["***", "***"], "keep": 7}
    assert value not in api.get(f"/api/v1/runs/{run['id']}").text
