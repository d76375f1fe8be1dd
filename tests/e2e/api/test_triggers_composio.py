"""Composio events at /hooks/composio, signed locally as Standard Webhooks in the payload
shapes Composio documents: matching by slug, connected account and filters; dedupe."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select
from standardwebhooks.webhooks import Webhook

from floom.services.triggers.composio import matches, read_event
from floom.store.db import session_scope
from floom.store.triggers import WebhookDelivery
from floom.triggers.spec import ComposioSpec
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
)

SECRET = "whsec_" + "Y29tcG9zaW8tdGVzdC1zZWNyZXQtMDEyMzQ1Njc4OQ=="
ECHO = """import json
inputs = json.load(open("inputs.json"))
json.dump({"outputs": {"event": inputs.get("event"), "author": inputs.get("author")}},
          open("result.json", "w"))
"""


@pytest.fixture
def composio_server(tmp_path: Path, database_url: str) -> Iterator[LiveServer]:
    with live_server(tmp_path / "data", database_url, composio_webhook_secret=SECRET) as srv:
        yield srv


def v3_event(slug: str, account: str, data: dict[str, Any], msg_id: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "composio.trigger.message",
        "timestamp": "2026-01-15T11:00:00Z",
        "metadata": {
            "log_id": "log_1",
            "trigger_slug": slug,
            "trigger_id": "ti_1",
            "connected_account_id": account,
            "auth_config_id": "ac_1",
            "user_id": "user_1",
        },
        "data": data,
    }


def send(server: LiveServer, payload: dict[str, Any], msg_id: str, secret: str = SECRET) -> Any:
    body = json.dumps(payload)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body),
        "x-composio-webhook-version": "V3",
        "content-type": "application/json",
    }
    with httpx.Client(base_url=server.base_url, timeout=30) as anonymous:
        return anonymous.post("/hooks/composio", content=body, headers=headers)


def deploy_listener(api: httpx.Client, tmp_path: Path, name: str, trigger: str) -> None:
    manifest = (
        f"name: {name}\ninputs: {{event: object, author: string}}\n"
        f"triggers:\n  - composio: {trigger}\n"
    )
    deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": ECHO}))


def test_a_composio_event_runs_the_workers_whose_trigger_matches(
    composio_server: LiveServer, tmp_path: Path
) -> None:
    with composio_server.client() as api:
        deploy_listener(
            api,
            tmp_path,
            "commits",
            "{event: GITHUB_COMMIT_EVENT, connected_account: ca_123, filters: {repo: acme/api}, "
            "inputs: {author: data.author}}",
        )
        deploy_listener(api, tmp_path, "any-commit", "{event: github_commit_event}")
        other_account = "{event: GITHUB_COMMIT_EVENT, connected_account: ca_999}"
        deploy_listener(api, tmp_path, "other-account", other_account)
        other_repo = "{event: GITHUB_COMMIT_EVENT, filters: {repo: [acme/web, acme/docs]}}"
        deploy_listener(api, tmp_path, "other-repo", other_repo)
        deploy_listener(api, tmp_path, "slack", "{event: SLACK_RECEIVE_MESSAGE}")

        data = {"repo": "acme/api", "author": "ada", "message": "Fix the parser"}
        payload = v3_event("GITHUB_COMMIT_EVENT", "ca_123", data, "msg_c1")
        resp = send(composio_server, payload, "msg_c1")

        assert resp.status_code == 202, resp.text
        started = {d["worker"]: d for d in resp.json()["deliveries"]}
        assert set(started) == {"commits", "any-commit"}
        run = wait_for_run(api, started["commits"]["run_id"])
        assert run["status"] == "succeeded"
        assert run["trigger"] == "composio"
        assert run["outputs"] == {"event": payload, "author": "ada"}
        (delivery,) = api.get("/api/v1/workers/commits/deliveries").json()["items"]
        assert (delivery["source"], delivery["event"]) == ("composio", "GITHUB_COMMIT_EVENT")

        again = send(composio_server, payload, "msg_c1")
        assert again.status_code == 200
        assert again.json()["duplicate"] is True
        assert {d["run_id"] for d in again.json()["deliveries"]} == {
            d["run_id"] for d in started.values()
        }
        assert len(api.get("/api/v1/runs", params={"trigger": "composio"}).json()["items"]) == 2

        other = send(composio_server, v3_event("NOTION_PAGE_ADDED", "ca_1", {}, "m2"), "m2")
        assert other.status_code == 202
        assert [d["outcome"] for d in other.json()["deliveries"]] == ["unmatched"]

        forged = send(composio_server, payload, "msg_c3", secret="whsec_" + "d3Jvbmc=")
        assert (forged.status_code, forged.json()["error"]["code"]) == (
            401,
            "webhook_signature_invalid",
        )


def test_older_composio_payload_shapes_are_read_too() -> None:
    spec = ComposioSpec(event="GITHUB_COMMIT_EVENT", connected_account="ca_1", filters={"n": 3})
    v2 = {"type": "github_commit_event", "data": {"connection_nano_id": "ca_1", "n": 3}}
    v1 = {"trigger_name": "GITHUB_COMMIT_EVENT", "connection_id": "ca_1", "payload": {"n": 3}}
    for payload in (v2, v1):
        event = read_event(payload)
        assert event is not None
        assert matches(spec, event)
    wrong = read_event({**v1, "payload": {"n": "4"}})
    assert wrong is not None
    assert not matches(spec, wrong)
    assert read_event({"type": "composio.connected_account.expired", "data": []}) is None


def test_a_composio_triggers_callback_url_is_checked_at_deploy_and_gets_each_runs_record(
    tmp_path: Path, database_url: str
) -> None:
    from tests.support.rigs.alerts import receiver

    with receiver() as done:
        trigger = f"{{event: GITHUB_COMMIT_EVENT, callback_url: '{done.url}'}}"
        # A server whose egress guard closes loopback refuses the URL when it is set.
        with (
            live_server(
                tmp_path / "closed", database_url, composio_webhook_secret=SECRET
            ) as closed,
            closed.client() as api,
        ):
            manifest = (
                f"name: told\ninputs: {{event: object}}\ntriggers:\n  - composio: {trigger}\n"
            )
            folder = make_worker(tmp_path / "told", manifest, {"run.py": "pass\n"})
            resp = api.post(
                "/api/v1/workers",
                content=_archive(folder),
                headers={"Content-Type": "application/gzip"},
            )
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert error["code"] == "manifest_invalid"
            assert "triggers[0].composio.callback_url" in error["message"]
            assert "public addresses" in error["message"]
            assert api.get("/api/v1/workers/told").status_code == 404  # nothing stored
            checked = api.post(
                "/api/v1/workers/validate",
                content=_archive(folder),
                headers={"Content-Type": "application/gzip"},
            ).json()
            assert [p["path"] for p in checked["problems"]] == ["triggers[0].composio.callback_url"]
            bad = make_worker(
                tmp_path / "bad",
                "name: bad\ninputs: {event: object}\n"
                "triggers:\n  - composio: {event: X, callback_url: 'ftp://x'}\n",
                {"run.py": "pass\n"},
            )
            resp = api.post(
                "/api/v1/workers",
                content=_archive(bad),
                headers={"Content-Type": "application/gzip"},
            )
            assert resp.status_code == 400
            assert "triggers[0].composio.callback_url" in resp.json()["error"]["message"]
        # One that lets floom reach the receiver (as a public address would be) takes it.
        with (
            live_server(
                tmp_path / "open",
                database_url,
                composio_webhook_secret=SECRET,
                agent_http_allow_private=True,
                alert_poll_seconds=0.1,
            ) as srv,
            srv.client() as api,
        ):
            deploy_listener(api, tmp_path, "told", trigger)
            payload = v3_event("GITHUB_COMMIT_EVENT", "ca_1", {"author": "ada"}, "msg_cb")
            resp = send(srv, payload, "msg_cb")
            assert resp.status_code == 202, resp.text
            (started,) = resp.json()["deliveries"]
            (record,) = done.wait_for(1)
            key = api.get("/api/v1/alerts/callback-key").json()["key"]
            Webhook(key).verify(done.accepted[0][1], done.accepted[0][0])
            assert record["run"]["id"] == started["run_id"]
            assert record["run"]["trigger"] == "composio"
            assert record["run"]["status"] == "succeeded"


def _archive(folder: Path) -> bytes:
    from floom.bundle import read_folder

    return read_folder(folder, max_bytes=10 * 1024 * 1024).to_archive()


def test_an_unmatched_composio_event_is_stored_with_the_webhooks_secret_masked(
    composio_server: LiveServer,
) -> None:
    # A sender that echoes the subscription's secret in its body (a misconfigured relay, say):
    # the stored delivery keeps no copy of it, matched or not.
    data = {"note": f"the secret is {SECRET}"}
    resp = send(composio_server, v3_event("NOTION_PAGE_ADDED", "ca_1", data, "m9"), "m9")
    assert resp.status_code == 202, resp.text
    assert [d["outcome"] for d in resp.json()["deliveries"]] == ["unmatched"]
    with session_scope(composio_server.ctx.engine) as s:
        (stored,) = s.exec(select(WebhookDelivery).where(WebhookDelivery.outcome == "unmatched"))
    assert SECRET.encode() not in stored.body
    assert b"the secret is ***" in stored.body
    assert SECRET not in stored.headers_json
