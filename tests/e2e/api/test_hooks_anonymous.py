"""What an anonymous sender learns from /hooks: the one 401 for a hook that is absent or not
ready and for a bad signature (test_hook_boundaries.py compares them), never the name of a
secret or a setting; the operator finds the reason in the log."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    dribbled_answer,
    live_server,
    make_worker,
)

COMPOSIO_SECRET = "whsec_" + "YW5vbnltb3VzLXRlc3Qtc2VjcmV0LTAxMjM0NTY3ODk="
# Words an anonymous answer must never carry: setting names and the worker's secret name.
TELLTALES = ("FLOOM_", "COMPOSIO_WEBHOOK_SECRET", "UNSET_HOOK_SECRET")


def anonymous_post(server: LiveServer, path: str, body: bytes, **headers: str) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=30) as anonymous:
        return anonymous.post(path, content=body, headers=headers)


def assert_tells_nothing(resp: httpx.Response) -> None:
    error = resp.json()["error"]
    assert set(error) >= {"code", "message", "hint"}
    for word in TELLTALES:
        assert word not in resp.text, (word, resp.text)


def signed(body: bytes, msg_id: str, secret: str) -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }


@pytest.fixture
def composio_server(tmp_path: Path, database_url: str) -> Iterator[LiveServer]:
    with live_server(
        tmp_path / "data", database_url, composio_webhook_secret=COMPOSIO_SECRET
    ) as srv:
        yield srv


def test_an_unsigned_composio_event_without_a_configured_secret_gets_401_and_the_log_says_why(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="floom"):
        resp = anonymous_post(server, "/hooks/composio", b"{}", **{"content-type": "text/json"})
        signed_resp = anonymous_post(
            server, "/hooks/composio", b"{}", **signed(b"{}", "msg_1", COMPOSIO_SECRET)
        )

    assert (resp.status_code, resp.json()["error"]["code"]) == (401, "webhook_unsigned")
    assert (signed_resp.status_code, signed_resp.json()["error"]["code"]) == (
        401,
        "webhook_signature_invalid",
    )
    for answer in (resp, signed_resp):
        assert_tells_nothing(answer)
    assert "FLOOM_COMPOSIO_WEBHOOK_SECRET" in caplog.text


def test_a_composio_event_with_a_bad_or_missing_signature_gets_401_naming_no_setting(
    composio_server: LiveServer,
) -> None:
    body = json.dumps({"type": "composio.trigger.message"}).encode()
    unsigned = anonymous_post(composio_server, "/hooks/composio", body)
    forged = anonymous_post(
        composio_server,
        "/hooks/composio",
        body,
        **signed(body, "msg_2", "whsec_" + "bm90LXRoZS1yaWdodC1zZWNyZXQtYXQtYWxsLTAx"),
    )

    assert (unsigned.status_code, unsigned.json()["error"]["code"]) == (401, "webhook_unsigned")
    assert (forged.status_code, forged.json()["error"]["code"]) == (
        401,
        "webhook_signature_invalid",
    )
    for answer in (unsigned, forged):
        assert_tells_nothing(answer)


def test_a_worker_webhook_whose_secret_is_unset_answers_as_an_absent_one_and_logs_the_name(
    server: LiveServer, api: httpx.Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = "name: unready\ninputs: {event: object}\ntriggers:\n"
    manifest += "  - webhook: {secret: UNSET_HOOK_SECRET}\n"
    deploy_folder(api, make_worker(tmp_path / "unready", manifest, {"run.py": "print(1)\n"}))
    body = b'{"a": 1}'
    headers = signed(body, "msg_3", COMPOSIO_SECRET)

    with caplog.at_level(logging.WARNING, logger="floom"):
        unready = anonymous_post(server, "/hooks/unready", body, **headers)
    absent = anonymous_post(server, "/hooks/nobody", body, **headers)

    assert (unready.status_code, unready.json()["error"]["code"]) == (
        401,
        "webhook_signature_invalid",
    )
    assert_tells_nothing(unready)
    assert unready.json() == absent.json()
    assert "UNSET_HOOK_SECRET" in caplog.text
    assert "/hooks/unready" in caplog.text
    assert api.get("/api/v1/workers/unready/deliveries").json()["items"] == []


def test_a_standard_webhook_whose_secret_is_no_key_answers_like_an_absent_one_and_logs_why(
    server: LiveServer, api: httpx.Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The library decodes a secret leniently: "xy!!!!!!" is the 1-byte key b64decode("xy==")
    # (a sender who tries 256 keys forges any delivery), "!!!!" is no key (it raised: a 500).
    weak = {"weak": "xy!!!!!!", "empty": "!!!!"}
    for name, value in weak.items():
        secret_name = f"{name.upper()}_HOOK_SECRET"
        secrets.set_secret(server.ctx, name=secret_name, value=value, caller=SYSTEM)
        manifest = f"name: {name}\ninputs: {{event: object}}\ntriggers:\n"
        manifest += f"  - webhook: {{secret: {secret_name}}}\n"
        deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": "print(1)\n"}))
    body = b'{"a": 1}'
    now = datetime.now(UTC)
    forged = {
        "webhook-id": "msg_weak",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(base64.b64decode("xy==")).sign("msg_weak", now, body),
        "content-type": "application/json",
    }

    with caplog.at_level(logging.WARNING, logger="floom"):
        answers = [anonymous_post(server, f"/hooks/{name}", body, **forged) for name in weak]
    absent = anonymous_post(server, "/hooks/nobody", body, **forged)

    for answer in answers:
        assert answer.status_code == 401, answer.text
        assert answer.json() == absent.json()
    for name in weak:
        assert f"{name.upper()}_HOOK_SECRET is not a Standard Webhooks key" in caplog.text
        assert api.get(f"/api/v1/workers/{name}/deliveries").json()["items"] == []
    for value in weak.values():
        assert value not in caplog.text


def test_a_composio_secret_that_is_no_key_answers_like_an_unset_one_and_logs_why(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps({"type": "composio.trigger.message"}).encode()
    now = datetime.now(UTC)
    forged = {
        "webhook-id": "msg_weak",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(base64.b64decode("xy==")).sign("msg_weak", now, body),
    }
    for value in ("xy!!!!!!", "!!!!"):
        with (
            live_server(tmp_path / value, database_url, composio_webhook_secret=value) as srv,
            caplog.at_level(logging.WARNING, logger="floom"),
        ):
            answer = anonymous_post(srv, "/hooks/composio", body, **forged)
        assert (answer.status_code, answer.json()["error"]["code"]) == (
            401,
            "webhook_signature_invalid",
        )
        assert_tells_nothing(answer)
        assert "FLOOM_COMPOSIO_WEBHOOK_SECRET is not a Standard Webhooks key" in caplog.text


def test_an_oversized_webhook_body_is_refused_without_naming_the_setting(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    limit = server.ctx.settings.webhook_max_bytes
    with caplog.at_level(logging.WARNING, logger="floom"):
        resp = anonymous_post(server, "/hooks/composio", b"x" * (limit + 1))

    assert (resp.status_code, resp.json()["error"]["code"]) == (413, "payload_too_large")
    assert_tells_nothing(resp)
    assert "FLOOM_WEBHOOK_MAX_BYTES" in caplog.text


@pytest.mark.parametrize("path", ["/hooks/composio", "/hooks/someworker"])
def test_a_webhook_body_dribbled_slower_than_its_deadline_is_answered_408_not_held(
    tmp_path: Path, database_url: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Anyone may send to /hooks: a sender that declares a body and sends part of it held the
    # connection for good (a slow-loris: many such hold the server's connections). The whole
    # body now has FLOOM_WEBHOOK_BODY_SECONDS to arrive.
    with (
        live_server(tmp_path / "data", database_url, webhook_body_seconds=0.5) as srv,
        caplog.at_level(logging.WARNING, logger="floom"),
    ):
        head, body = dribbled_answer(srv.base_url, path)
        assert head.startswith(b"HTTP/1.1 408"), head
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout"
        for word in TELLTALES:
            assert word not in body.decode(), word
        assert "FLOOM_WEBHOOK_BODY_SECONDS" in caplog.text
