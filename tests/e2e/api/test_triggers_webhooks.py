"""Signed webhooks through the live server: each signature kind, each refusal, duplicate
delivery ids, replay, ?wait, pause, and the triggers API."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook

from floom.bundle import read_folder
from floom.triggers.signatures import sign_floom
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

STANDARD_SECRET = "whsec_" + "c2VjcmV0LWtleS1mb3ItdGVzdHMtMTIzNDU2Nzg5MA=="
GITHUB_SECRET = "gh-hook-secret-123"
HMAC_SECRET = "plain-hmac-secret-456"

ECHO = """import json
inputs = json.load(open("inputs.json"))
event = inputs.get("event")
result = {"kind": type(event).__name__, "event": event, "repo": inputs.get("repo")}
json.dump({"outputs": result}, open("result.json", "w"))
"""


def deploy_hook(api: httpx.Client, tmp_path: Path, name: str, manifest: str) -> None:
    deploy_folder(api, make_worker(tmp_path / name, f"name: {name}\n{manifest}", {"run.py": ECHO}))


def standard_headers(body: bytes, msg_id: str, *, at: datetime | None = None) -> dict[str, str]:
    when = at or datetime.now(UTC)
    signature = Webhook(STANDARD_SECRET).sign(msg_id, when, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def github_headers(body: bytes, delivery: str) -> dict[str, str]:
    mac = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "push",
        "Content-Type": "application/json",
    }


def hook(server: LiveServer, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=60) as anonymous:
        return anonymous.post(path, content=body, headers=headers)


def setup_standard(api: httpx.Client, tmp_path: Path) -> None:
    api.put("/api/v1/secrets/STD_HOOK_SECRET", json={"value": STANDARD_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "std",
        "inputs: {event: object}\ntriggers:\n  - webhook: {secret: STD_HOOK_SECRET}\n",
    )


def runs_of(api: httpx.Client, worker: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get("/api/v1/runs", params={"worker": worker}).json()["items"]
    return items


def test_a_standard_webhook_starts_a_run_with_the_body_as_its_event(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    setup_standard(api, tmp_path)
    body = json.dumps({"action": "opened", "number": 7}).encode()
    resp = hook(server, "/hooks/std", body, standard_headers(body, "msg_1"))

    assert resp.status_code == 202, resp.text
    answer = resp.json()
    assert answer["outcome"] == "run"
    assert answer["duplicate"] is False
    run = wait_for_run(api, answer["run_id"])
    assert run["status"] == "succeeded", run
    assert run["trigger"] == "webhook"
    assert run["outputs"]["event"] == {"action": "opened", "number": 7}

    (delivery,) = api.get("/api/v1/workers/std/deliveries").json()["items"]
    assert (delivery["delivery_id"], delivery["run_id"]) == ("msg_1", run["id"])
    stored = api.get(f"/api/v1/deliveries/{delivery['id']}").json()
    assert json.loads(stored["body"]) == {"action": "opened", "number": 7}
    assert "webhook-id" in stored["headers"]
    assert "webhook-signature" not in stored["headers"]


def test_a_github_webhook_maps_body_fields_to_inputs_and_can_wait_for_outputs(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/GH_HOOK_SECRET", json={"value": GITHUB_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "gh",
        "inputs: {repo: {type: string, required: true}}\ntriggers:\n"
        "  - webhook: {signature: github, secret: GH_HOOK_SECRET, "
        "inputs: {repo: repository.full_name}}\n",
    )
    body = json.dumps({"ref": "refs/heads/main", "repository": {"full_name": "acme/api"}}).encode()
    resp = hook(server, "/hooks/gh?wait=30", body, github_headers(body, "guid-1"))

    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["status"] == "succeeded"
    assert answer["outputs"]["repo"] == "acme/api"
    (delivery,) = api.get("/api/v1/workers/gh/deliveries").json()["items"]
    assert delivery["event"] == "push"
    assert delivery["delivery_id"] == "guid-1"


def test_an_hmac_sha256_webhook_delivers_a_text_body_to_a_string_event(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/HMAC_HOOK_SECRET", json={"value": HMAC_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "plain",
        "inputs: {event: string}\ntriggers:\n"
        "  - webhook: {signature: hmac-sha256, secret: HMAC_HOOK_SECRET}\n",
    )
    body = b"disk almost full on db-1"
    headers = sign_floom(secret=HMAC_SECRET, body=body, timestamp=int(time.time()))
    resp = hook(server, "/hooks/plain?wait=30", body, {**headers, "Content-Type": "text/plain"})

    assert resp.status_code == 200, resp.text
    assert resp.json()["outputs"] == {
        "kind": "str",
        "event": "disk almost full on db-1",
        "repo": None,
    }


def test_unsigned_badly_signed_stale_and_oversized_requests_are_refused_and_create_nothing(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    setup_standard(api, tmp_path)
    api.put("/api/v1/secrets/HMAC_HOOK_SECRET", json={"value": HMAC_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "plain",
        "inputs: {event: string}\ntriggers:\n"
        "  - webhook: {signature: hmac-sha256, secret: HMAC_HOOK_SECRET}\n",
    )
    body = b'{"action": "opened"}'
    good = standard_headers(body, "msg_x")
    old = datetime.now(UTC) - timedelta(minutes=6)
    now = int(time.time())
    cases = [
        ("/hooks/std", body, {"content-type": "application/json"}, 401, "webhook_unsigned"),
        ("/hooks/std", body + b" ", good, 401, "webhook_signature_invalid"),
        (
            "/hooks/std",
            body,
            {**good, "webhook-signature": "v1,AAAA"},
            401,
            "webhook_signature_invalid",
        ),
        ("/hooks/std", body, standard_headers(body, "msg_y", at=old), 401, "webhook_stale"),
        ("/hooks/plain", body, {}, 401, "webhook_unsigned"),
        (
            "/hooks/plain",
            body,
            sign_floom(secret="not-the-secret", body=body, timestamp=now),
            401,
            "webhook_signature_invalid",
        ),
        (
            "/hooks/plain",
            body,
            sign_floom(secret=HMAC_SECRET, body=body, timestamp=now - 400),
            401,
            "webhook_stale",
        ),
        ("/hooks/std", b"x" * (1024 * 1024 + 1), good, 413, "payload_too_large"),
        ("/hooks/nobody", body, good, 401, "webhook_signature_invalid"),
    ]
    for path, payload, headers, status, code in cases:
        resp = hook(server, path, payload, headers)
        assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), (path, code)

    for worker in ("std", "plain"):
        assert api.get(f"/api/v1/workers/{worker}/deliveries").json()["items"] == []
        assert runs_of(api, worker) == []


def test_a_repeated_delivery_id_is_acknowledged_and_not_run_again(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    setup_standard(api, tmp_path)
    body = b'{"n": 1}'
    first = hook(server, "/hooks/std", body, standard_headers(body, "msg_dup"))
    again = hook(server, "/hooks/std", body, standard_headers(body, "msg_dup"))

    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert again.json()["run_id"] == first.json()["run_id"]
    assert len(runs_of(api, "std")) == 1
    assert len(api.get("/api/v1/workers/std/deliveries").json()["items"]) == 1


def test_a_captured_request_sent_again_under_a_new_delivery_id_is_a_duplicate(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/GH_HOOK_SECRET", json={"value": GITHUB_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "gh",
        "inputs: {event: object}\ntriggers:\n"
        "  - webhook: {signature: github, secret: GH_HOOK_SECRET}\n",
    )
    body = b'{"zen": "Keep it logically awesome."}'
    first = hook(server, "/hooks/gh", body, github_headers(body, "guid-a"))
    # GitHub's delivery id is not signed: a replayed request may carry any id.
    again = hook(server, "/hooks/gh", body, github_headers(body, "guid-b"))
    redelivered = hook(server, "/hooks/gh", body, github_headers(body, "guid-a"))

    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert redelivered.json()["run_id"] == first.json()["run_id"]
    assert len(runs_of(api, "gh")) == 1


def test_a_stored_delivery_can_be_replayed_as_a_new_run(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    setup_standard(api, tmp_path)
    body = b'{"action": "closed"}'
    original = hook(server, "/hooks/std", body, standard_headers(body, "msg_r")).json()
    wait_for_run(api, original["run_id"])

    replay = api.post(f"/api/v1/deliveries/{original['delivery_id']}/replay")
    assert replay.status_code == 202, replay.text
    run = wait_for_run(api, replay.json()["id"])
    assert run["trigger"] == "replay"
    assert run["replay_of"] == original["run_id"]
    assert run["outputs"]["event"] == {"action": "closed"}
    (delivery,) = api.get("/api/v1/workers/std/deliveries").json()["items"]
    assert delivery["replay_count"] == 1


def test_a_paused_worker_stores_webhooks_as_skipped_and_refuses_manual_runs_without_force(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    setup_standard(api, tmp_path)
    assert api.post("/api/v1/workers/std/pause").json()["paused"] is True
    body = b'{"while": "paused"}'
    resp = hook(server, "/hooks/std", body, standard_headers(body, "msg_p"))

    assert resp.status_code == 202
    assert resp.json()["outcome"] == "paused"
    (skipped,) = api.get("/api/v1/runs", params={"worker": "std", "status": "skipped"}).json()[
        "items"
    ]
    assert skipped["trigger"] == "webhook"
    assert skipped["error"]["code"] == "paused"
    # The answer names the skipped run that was stored for the delivery.
    assert (resp.json()["run_id"], resp.json()["status"]) == (skipped["id"], "skipped")
    delivery_id = resp.json()["delivery_id"]
    refused = api.post(f"/api/v1/deliveries/{delivery_id}/replay")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "worker_paused")
    manual = api.post("/api/v1/workers/std/runs", json={"inputs": {"event": {}}})
    assert manual.json()["error"]["code"] == "worker_paused"
    assert '"force": true' in manual.json()["error"]["hint"]
    forced = api.post("/api/v1/workers/std/runs", json={"inputs": {"event": {}}, "force": True})
    assert forced.status_code == 202
    assert forced.json()["trigger"] == "api"
    cli = api.post(
        "/api/v1/workers/std/runs",
        json={"inputs": {"event": {}}, "force": True},
        headers={"X-Floom-Client": "cli"},
    )
    assert cli.json()["trigger"] == "manual"

    api.post("/api/v1/workers/std/resume")
    replayed = api.post(f"/api/v1/deliveries/{delivery_id}/replay")
    assert wait_for_run(api, replayed.json()["id"])["outputs"]["event"] == {"while": "paused"}


def test_a_delivery_refused_for_its_inputs_answers_with_the_skipped_run_it_stored(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/STD_HOOK_SECRET", json={"value": STANDARD_SECRET})
    deploy_hook(
        api,
        tmp_path,
        "mapped",
        "inputs: {repo: {type: string, required: true}}\ntriggers:\n"
        "  - webhook: {secret: STD_HOOK_SECRET, inputs: {repo: repository.full_name}}\n",
    )
    body = b'{"repository": {}}'
    refused = hook(server, "/hooks/mapped", body, standard_headers(body, "msg_bad"))

    assert refused.status_code == 422, refused.text
    error, delivery = refused.json()["error"], refused.json()["delivery"]
    assert error["code"] == "input_invalid"
    assert "repo" in error["message"]
    assert "floom " not in json.dumps(error)  # the sender is a plain REST client
    # What the answer says is what was stored: the delivery and the skipped run it names.
    (skipped,) = runs_of(api, "mapped")
    assert (delivery["run_id"], delivery["status"]) == (skipped["id"], "skipped")
    assert skipped["status"] == "skipped"
    assert skipped["error"]["code"] == "input_invalid"
    assert delivery["outcome"] == "input_invalid"
    (stored,) = api.get("/api/v1/workers/mapped/deliveries").json()["items"]
    assert (stored["id"], stored["delivery_id"]) == (delivery["delivery_id"], "msg_bad")
    assert (stored["outcome"], stored["run_id"]) == ("input_invalid", skipped["id"])
    # The same delivery again is a duplicate that names the same skipped run, and stores nothing.
    again = hook(server, "/hooks/mapped", body, standard_headers(body, "msg_bad"))
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert (again.json()["run_id"], again.json()["status"]) == (skipped["id"], "skipped")
    assert len(runs_of(api, "mapped")) == 1


def test_the_triggers_api_lists_next_fires_in_the_timezone_and_the_webhook_url(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_hook(
        api,
        tmp_path,
        "both",
        "inputs: {event: object}\ntriggers:\n"
        '  - schedule: {cron: "0 9 * * mon-fri", timezone: Europe/Berlin}\n'
        "  - webhook: {secret: BOTH_SECRET}\n",
    )
    listing = api.get("/api/v1/workers/both/triggers").json()
    schedule, webhook = listing["items"]

    assert schedule["timezone"] == "Europe/Berlin"
    assert len(schedule["next_fires"]) == 3
    for fire in schedule["next_fires"]:
        when = datetime.fromisoformat(fire)
        assert (when.hour, when.minute) == (9, 0)
        assert when.weekday() < 5
        assert fire.endswith(("+01:00", "+02:00"))
    assert webhook["url"] == f"{server.base_url}/hooks/both"
    assert webhook["secret_set"] is False
    unready = hook(server, "/hooks/both", b"{}", {"webhook-id": "x"})
    assert (unready.status_code, unready.json()["error"]["code"]) == (401, "webhook_unsigned")

    paused = api.post("/api/v1/workers/both/pause", json={"trigger_id": schedule["id"]}).json()
    assert [t["paused"] for t in paused["items"]] == [True, False]
    worker = api.get("/api/v1/workers/both").json()
    assert worker["triggers"][0]["timezone"] == "Europe/Berlin"
    # A paused schedule fires never: it has no next fire until it is resumed.
    assert (worker["triggers"][0]["active"], worker["triggers"][0]["next_fire"]) == (False, None)
    assert paused["items"][0]["next_fires"] == []
    api.post("/api/v1/workers/both/resume", json={"trigger_id": schedule["id"]})
    worker = api.get("/api/v1/workers/both").json()
    assert worker["triggers"][0]["next_fire"] == schedule["next_fires"][0]


def test_a_hook_s_callback_url_is_refused_unless_worker_yml_lists_its_origin(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    """The query is outside every signature scheme: a request altered in flight, or sent
    again under a new id, must not choose where a run's record goes."""
    api.put("/api/v1/secrets/HMAC_HOOK_SECRET", json={"value": HMAC_SECRET})
    webhook = "{signature: hmac-sha256, secret: HMAC_HOOK_SECRET"
    deploy_hook(
        api, tmp_path, "open", f"inputs: {{event: object}}\ntriggers:\n  - webhook: {webhook}}}\n"
    )
    listed = "callbacks: [https://ci.example.com, 'http://[::1]:8080/']"
    deploy_hook(
        api,
        tmp_path,
        "listed",
        f"inputs: {{event: object}}\ntriggers:\n  - webhook: {webhook}, {listed}}}\n",
    )

    def send(worker: str, delivery: str, callback: str) -> httpx.Response:
        body = json.dumps({"n": delivery}).encode()
        headers = sign_floom(secret=HMAC_SECRET, body=body, timestamp=int(time.time()))
        headers["X-Floom-Delivery"] = delivery
        return hook(server, f"/hooks/{worker}?callback_url={callback}", body, headers)

    for worker, callback, said in (
        ("open", "https://attacker.example/steal", "names no callback origins"),
        ("listed", "https://attacker.example/steal", "is not an origin this webhook lists"),
        ("listed", "https://ci.example.com.attacker.example/x", "is not an origin"),
        ("listed", "http://ci.example.com/x", "is not an origin"),  # another scheme
        ("listed", "https://ci.example.com:8443/x", "is not an origin"),  # another port
        ("listed", "https://user@attacker.example/x", "is not an origin"),
    ):
        refused = send(worker, f"d-{worker}-{callback}", callback)
        assert refused.status_code == 422, (callback, refused.text)
        error = refused.json()["error"]
        assert error["code"] == "input_invalid", error
        assert said in error["message"], error
        assert "callback_url" in error["message"], error
    # Refused before anything was stored: no delivery, no run.
    for worker in ("open", "listed"):
        assert api.get(f"/api/v1/workers/{worker}/deliveries").json()["items"] == []
        assert runs_of(api, worker) == []
    # A listed origin passes this check (the egress guard then judges the host as for any
    # callback: this test server refuses the loopback address).
    passed = send("listed", "d-ok", "http://[::1]:8080/done")
    assert passed.status_code == 422, passed.text
    assert "origin" not in passed.json()["error"]["message"], passed.text
    assert "callback_url" in passed.json()["error"]["message"], passed.text


def test_a_webhook_s_callbacks_in_worker_yml_must_be_origins(
    api: httpx.Client, tmp_path: Path
) -> None:
    for callbacks, said in (
        ("https://ci.example.com", "must be a list"),
        ("[https://ci.example.com/path]", "is not an http(s) origin"),
        ("[ftp://ci.example.com]", "is not an http(s) origin"),
        ("['https://a.example?x=1']", "is not an http(s) origin"),
        ("[https://u:p@a.example]", "is not an http(s) origin"),
        ("[" + ", ".join(f"https://h{i}.example" for i in range(11)) + "]", "at most 10"),
    ):
        manifest = (
            "name: bad\ninputs: {event: object}\ntriggers:\n"
            f"  - webhook: {{secret: S, callbacks: {callbacks}}}\n"
        )
        folder = make_worker(
            tmp_path / f"bad{len(said)}{len(callbacks)}", manifest, {"run.py": ECHO}
        )
        resp = api.post(
            "/api/v1/workers/validate",
            content=read_folder(folder, max_bytes=1 << 20).to_archive(),
            headers={"Content-Type": "application/gzip"},
        )
        problems = json.dumps(resp.json())
        assert "triggers[0].webhook.callbacks" in problems, problems
        assert said in problems, problems
