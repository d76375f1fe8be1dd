"""Alerts end to end on both stores: a real server runs failing and recovering workers, the
alert loop sends to loopback receivers that fail, hang and recover, and to a real SMTP
server; signatures are checked with the Standard Webhooks library."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from floom.net import egress
from floom.services.access import keys, secrets
from floom.services.access.principal import SYSTEM
from floom.services.alerts.watch import watch
from tests.standins.http import STOP_POLL_SECONDS
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.rigs.alerts import receiver, smtp_server
from tests.support.web import signed_in_client

SIGNING_KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()
FAST = {
    "agent_http_allow_private": True,  # the receivers are on loopback
    "alert_poll_seconds": 0.1,
    "alert_retry_seconds": 0.1,
    "alert_timeout_seconds": 1.0,
}
FLAKY = """\
name: flaky
inputs:
  fail: {type: boolean, default: false}
alerts:
  - events: [run.failed]
    channels: [hook]
"""
FLAKY_RUN = """\
import json, sys
if json.load(open("inputs.json"))["fail"]:
    print("boom", file=sys.stderr)
    sys.exit(3)
"""


# Fails saying its secret, in the error floom keeps for the run.
LEAKY_RUN = """\
import json, os
if json.load(open("inputs.json"))["fail"]:
    result = {"error": "boom " + os.environ["TOKEN"], "retryable": False}
    json.dump(result, open("result.json", "w"))
"""


@contextmanager
def alert_server(tmp: Path, database_url: str, **overrides: Any) -> Iterator[LiveServer]:
    """A live server (its node runs the alert loop) with quick alert settings."""
    with live_server(tmp, database_url, **{**FAST, **overrides}) as srv:
        yield srv


def add_webhook_channel(api: httpx.Client, ctx: Any, url: str, name: str = "hook") -> None:
    secrets.set_secret(ctx, name="HOOK_KEY", value=SIGNING_KEY, caller=SYSTEM)
    resp = api.post(
        "/api/v1/alerts/channels",
        json={"name": name, "kind": "webhook", "config": {"url": url, "secret": "HOOK_KEY"}},
    )
    assert resp.status_code == 201, resp.text


def verified(headers: dict[str, str], body: bytes, key: str = SIGNING_KEY) -> dict[str, Any]:
    payload: dict[str, Any] = Webhook(key).verify(body, headers)
    return payload


def deliveries(api: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get("/api/v1/alerts/deliveries", params=params).json()[
        "items"
    ]
    return items


def test_a_failing_worker_alerts_once_per_incident_and_once_when_it_recovers(
    tmp_path: Path, database_url: str
) -> None:
    with receiver(plan=[500, 500]) as hook, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        add_webhook_channel(api, srv.ctx, hook.url)
        secrets.set_secret(srv.ctx, name="TOKEN", value="s3cr3t-value", caller=SYSTEM)
        folder = make_worker(
            tmp_path / "flaky",
            FLAKY.replace("alerts:", "secrets: [TOKEN]\nalerts:"),
            {"run.py": LEAKY_RUN},
        )
        deploy_folder(api, folder)
        for fail in (True, True):
            run = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": fail}}).json()
            assert wait_for_run(api, run["id"])["status"] == "failed"
        bodies = hook.wait_for(1)
        first = bodies[0]
        assert first["type"] == "run.failed"
        assert first["worker"] == "flaky"
        assert first["run_url"].endswith(f"/runs/{first['run_id']}")
        assert first["error"]["code"]
        assert "s3cr3t-value" not in str(hook.accepted[0][1])
        verified(*hook.accepted[0])
        ok = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": False}}).json()
        assert wait_for_run(api, ok["id"])["status"] == "succeeded"
        bodies = hook.wait_for(2)
        assert [b["type"] for b in bodies] == ["run.failed", "recovered"]
        assert bodies[1]["incident"]["status"] == "recovered"
        assert bodies[1]["incident"]["events"] == 2  # the second failure was grouped
        for headers, body in hook.accepted:
            verified(headers, body)
        # The receiver has the bodies; each delivery's row is marked after its answer.
        wait_until(
            lambda: (
                sorted(d["status"] for d in deliveries(api, purpose="alert"))
                == ["delivered", "delivered"]
            )
        )
        sent = deliveries(api, purpose="alert")
        first_sent = next(d for d in sent if d["type"] == "run.failed")
        assert first_sent["attempts"] == 3  # two 500s, then accepted
        assert hook.tried == 4


def test_a_receiver_that_hangs_is_tried_again_and_recorded_once(
    tmp_path: Path, database_url: str
) -> None:
    with (
        receiver(plan=["hang"], hang_seconds=2.5) as hook,
        alert_server(tmp_path / "d", database_url) as srv,
    ):
        api = srv.client()
        add_webhook_channel(api, srv.ctx, hook.url)
        folder = make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN})
        deploy_folder(api, folder)
        run = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": True}}).json()
        wait_for_run(api, run["id"])

        def delivered() -> list[dict[str, Any]]:
            return [d for d in deliveries(api, purpose="alert") if d["status"] == "delivered"]

        sent = wait_until(delivered, timeout=30)
        assert len(sent) == 1
        assert sent[0]["attempts"] == 2
        # The hung request was answered (accepted) after floom gave up on it, and the retry
        # was accepted too: the receiver saw the same webhook-id twice, floom one success.
        wait_until(lambda: len(hook.accepted) == 2)
        assert len({h["webhook-id"] for h, _ in hook.accepted}) == 1


def test_pending_alerts_survive_a_restart_and_are_delivered_once(
    tmp_path: Path, database_url: str
) -> None:
    data = tmp_path / "d"
    with receiver() as hook:
        url = hook.url
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # The receiver is gone: the alert fails and waits for its next try, which this server
    # does not live to make.
    with alert_server(data, database_url, alert_retry_seconds=2) as srv:
        api = srv.client()
        add_webhook_channel(api, srv.ctx, url)
        folder = make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN})
        deploy_folder(api, folder)
        run = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": True}}).json()
        wait_for_run(api, run["id"])
        wait_until(lambda: [d for d in deliveries(api) if d["attempts"] == 1])
        (pending,) = deliveries(api)
        assert pending["status"] == "pending"
        assert pending["last_error"]
    with receiver(port=port) as hook, alert_server(data, database_url) as srv:
        api = srv.client()
        hook.wait_for(1)
        wait_until(lambda: deliveries(api)[0]["status"] == "delivered")
        (sent,) = deliveries(api)
        assert sent["id"] == pending["id"]
        assert sent["attempts"] == 2
        assert len(hook.accepted) == 1
        verified(*hook.accepted[0])


def test_a_test_alert_reaches_a_real_smtp_server_over_starttls_with_auth(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with smtp_server(tmp_path, name="mail.test", user="floom", password="mail-pass-1") as mail:
        monkeypatch.setenv("SSL_CERT_FILE", str(mail.cert))
        with alert_server(
            tmp_path / "d", database_url, agent_http_resolve="mail.test=127.0.0.1"
        ) as srv:
            api = srv.client()
            secrets.set_secret(srv.ctx, name="SMTP_PASSWORD", value="mail-pass-1", caller=SYSTEM)
            config = {
                "host": "mail.test",
                "port": mail.port,
                "username": "floom",
                "password_secret": "SMTP_PASSWORD",
                "sender": "floom@example.com",
                "to": ["oncall@example.com"],
            }
            resp = api.post(
                "/api/v1/alerts/channels", json={"name": "mail", "kind": "email", "config": config}
            )
            assert resp.status_code == 201, resp.text
            assert "mail-pass-1" not in resp.text
            sent = api.post("/api/v1/alerts/channels/mail/test")
            assert sent.status_code == 200, sent.text
            assert sent.json()["status"] == "delivered"
            assert mail.logins == [("floom", "mail-pass-1")]
            (message,) = mail.messages
            assert message["To"] == "oncall@example.com"
            assert message["Subject"].startswith("[floom] test alert to channel mail")
            # A wrong password is a clear failure, recorded, and changes no setting.
            secrets.set_secret(srv.ctx, name="SMTP_PASSWORD", value="wrong-pass", caller=SYSTEM)
            failed = api.post("/api/v1/alerts/channels/mail/test")
            assert failed.status_code == 502
            error = failed.json()["error"]
            assert error["code"] == "alert_undeliverable"
            assert "login" in error["message"] or "logging in" in error["message"]
            assert api.get("/api/v1/alerts/channels").json()["items"][0]["config"] == {
                **{k: v for k, v in config.items()},
                "starttls": True,
            }
    assert os.environ.get("SSL_CERT_FILE")


@contextmanager
def mail_server_slow_to_take_the_first_mail() -> Iterator[tuple[int, list[Any], threading.Event]]:
    """aiosmtpd on loopback (no TLS, no login) that keeps every mail it is given, and answers
    the first one's DATA only once the event is set: as a mail server that took a mail and
    then answered after floom's deadline (or floom died before it recorded the answer)."""
    import asyncio
    from email import message_from_bytes

    from aiosmtpd.controller import Controller

    from tests.support.ports import free_port

    messages: list[Any] = []
    answer_first = threading.Event()

    class Handler:
        async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
            messages.append(message_from_bytes(envelope.content))
            if len(messages) == 1:
                await asyncio.get_running_loop().run_in_executor(None, answer_first.wait, 60)
            return "250 OK"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, messages, answer_first
    finally:
        answer_first.set()
        controller.stop()


def test_a_mail_sent_again_after_its_answer_came_too_late_has_the_same_message_id(
    tmp_path: Path, database_url: str
) -> None:
    # The server took the mail, and its answer came after the send's deadline: the delivery
    # is tried again and the server gets it twice. The receiver's mail system tells the two
    # apart from another alert's only by the Message-ID floom gives it: the same on every try.
    with (
        mail_server_slow_to_take_the_first_mail() as (port, messages, answer_first),
        alert_server(tmp_path / "d", database_url, agent_http_resolve="mail.test=127.0.0.1") as srv,
    ):
        api = srv.client()
        mail = {
            "host": "mail.test",
            "port": port,
            "starttls": False,
            "sender": "floom@example.com",
            "to": ["ops@example.com"],
        }
        created = api.post(
            "/api/v1/alerts/channels", json={"name": "hook", "kind": "email", "config": mail}
        )
        assert created.status_code == 201, created.text
        deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN}))
        run = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": True}}).json()
        wait_for_run(api, run["id"])
        wait_until(lambda: [d for d in deliveries(api) if d["status"] == "delivered"], timeout=30)
        answer_first.set()
        (sent,) = deliveries(api)
        assert sent["attempts"] == 2
        first, again = messages
        assert first["Message-ID"] == again["Message-ID"] == f"<{sent['id']}@example.com>"
        assert first["Date"] is not None
        # A test mail is a delivery of its own: another Message-ID.
        assert api.post("/api/v1/alerts/channels/hook/test").status_code == 200
        assert messages[-1]["Message-ID"] not in (None, first["Message-ID"])


def test_a_run_callback_is_signed_with_the_servers_key_and_retried(
    tmp_path: Path, database_url: str
) -> None:
    with receiver(plan=[503]) as hook, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        folder = make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN})
        deploy_folder(api, folder)
        run = api.post(
            "/api/v1/workers/flaky/runs",
            json={"inputs": {"fail": False}, "callback_url": hook.url + "?token=abc"},
        ).json()
        wait_for_run(api, run["id"])
        hook.wait_for(1)
        key = api.get("/api/v1/alerts/callback-key").json()["key"]
        body = verified(*hook.accepted[0], key=key)
        assert body["type"] == "run.ended"
        assert body["run"]["id"] == run["id"]
        assert body["run"]["status"] == "succeeded"
        # The row is marked after the receiver's answer: wait for it, not for the body.
        (sent,) = wait_until(
            lambda: [d for d in deliveries(api, purpose="callback") if d["status"] == "delivered"]
        )
        assert sent["attempts"] == 2
        assert sent["target"] == hook.url  # the query (a token, perhaps) is not shown
        # Only an admin reads the key.
        from floom.services.access import keys

        _, reader = keys.create_key(srv.ctx, caller=SYSTEM, scopes=["read"], name="r")
        assert srv.client(reader).get("/api/v1/alerts/callback-key").status_code == 403


def test_a_storm_sends_a_bounded_number_of_alerts(tmp_path: Path, database_url: str) -> None:
    with (
        receiver() as hook,
        alert_server(tmp_path / "d", database_url, alert_throttle_count=2) as srv,
    ):
        api = srv.client()
        add_webhook_channel(api, srv.ctx, hook.url)
        rule = {"name": "all", "events": ["run.*"], "channels": ["hook"]}
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 201
        for i in range(4):
            folder = make_worker(
                tmp_path / f"w{i}",
                f"name: w{i}\ninputs:\n  fail: {{type: boolean, default: true}}\n",
                {"run.py": FLAKY_RUN},
            )
            deploy_folder(api, folder)
            wait_for_run(api, api.post(f"/api/v1/workers/w{i}/runs", json={}).json()["id"])
        wait_until(lambda: len(deliveries(api, purpose="alert")) == 4)
        sent = deliveries(api, purpose="alert")
        assert sorted(d["status"] for d in sent).count("throttled") == 2
        hook.wait_for(2)
        throttled = next(d for d in sent if d["status"] == "throttled")
        assert api.post(f"/api/v1/alerts/deliveries/{throttled['id']}/resend").status_code == 202
        hook.wait_for(3)


def test_a_disabled_rule_routes_nothing_until_it_is_enabled_again(
    tmp_path: Path, database_url: str
) -> None:
    with receiver() as hook, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        add_webhook_channel(api, srv.ctx, hook.url)
        rule = {"name": "all", "events": ["run.failed"], "channels": ["hook"]}
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 201
        bad = api.patch("/api/v1/alerts/rules/all", json={"enabled": "maybe"})
        assert bad.status_code == 422
        assert "enabled" in bad.text
        assert api.patch("/api/v1/alerts/rules/nope", json={"enabled": False}).status_code == 404
        off = api.patch("/api/v1/alerts/rules/all", json={"enabled": False})
        assert off.status_code == 200, off.text
        assert off.json()["enabled"] is False
        assert api.get("/api/v1/alerts/rules").json()["items"][0]["enabled"] is False
        for i in range(2):
            folder = make_worker(
                tmp_path / f"w{i}",
                f"name: w{i}\ninputs:\n  fail: {{type: boolean, default: true}}\n",
                {"run.py": FLAKY_RUN},
            )
            deploy_folder(api, folder)
            if i == 1:
                on = api.patch("/api/v1/alerts/rules/all", json={"enabled": True})
                assert on.json()["enabled"] is True
            run = api.post(f"/api/v1/workers/w{i}/runs", json={}).json()
            assert wait_for_run(api, run["id"])["status"] == "failed"
            watch(srv.ctx)  # its failure is seen now (a pass is idempotent), rule on or off
        (alert,) = hook.wait_for(1)
        assert alert["worker"] == "w1"  # w0 failed while the rule was off
        wait_until(lambda: [d["status"] for d in deliveries(api, purpose="alert")] == ["delivered"])


HOOKED = """\
name: hooked
inputs:
  n: {type: integer, required: true}
triggers:
  - webhook: {signature: hmac-sha256, secret: HOOK_SECRET, inputs: {n: n}, callbacks: [%s]}
"""


def test_a_webhook_that_cannot_start_a_run_alerts_and_a_webhook_run_calls_back(
    tmp_path: Path, database_url: str
) -> None:
    import json
    import time

    from floom.triggers.signatures import sign_floom

    with receiver() as hook, receiver() as done, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        add_webhook_channel(api, srv.ctx, hook.url)
        secrets.set_secret(srv.ctx, name="HOOK_SECRET", value="hook-secret-1", caller=SYSTEM)
        rule = {"name": "hooks", "events": ["trigger.failed"], "channels": ["hook"]}
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 201
        origin = done.url.split("/", 3)[:3]
        hooked = HOOKED % "/".join(origin)
        deploy_folder(api, make_worker(tmp_path / "hooked", hooked, {"run.py": "pass\n"}))

        def send(n: object, delivery: str, callback: str | None = None) -> httpx.Response:
            body = json.dumps({"n": n}).encode()
            headers = sign_floom(secret="hook-secret-1", body=body, timestamp=int(time.time()))
            headers["X-Floom-Delivery"] = delivery
            params = {"callback_url": callback} if callback else None
            return httpx.post(
                f"{srv.base_url}/hooks/hooked", content=body, headers=headers, params=params
            )

        # Private addresses are allowed on this test server: a scheme it refuses instead.
        refused = send(1, "d0", callback="gopher://example.com/x")
        assert refused.status_code == 422, refused.text
        assert "callback_url" in refused.json()["error"]["message"]
        assert send("not a number", "d1").status_code == 422  # input_invalid: no run
        (alert,) = hook.wait_for(1)
        assert alert["type"] == "trigger.failed"
        assert alert["worker"] == "hooked"
        assert alert["error"]["code"] == "input_invalid"
        ok = send(2, "d2", callback=done.url)
        assert ok.status_code == 202, ok.text
        (record,) = done.wait_for(1)
        key = api.get("/api/v1/alerts/callback-key").json()["key"]
        verified(*done.accepted[0], key=key)
        assert record["run"]["id"] == ok.json()["run_id"]
        assert record["run"]["trigger"] == "webhook"
        assert [b["type"] for b in hook.wait_for(2)] == ["trigger.failed", "recovered"]


def test_a_slack_channel_gets_a_text_message_at_the_url_its_secret_holds(
    tmp_path: Path, database_url: str
) -> None:
    with receiver() as slack, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="SLACK_URL", value=slack.url, caller=SYSTEM)
        made = api.post(
            "/api/v1/alerts/channels",
            json={"name": "slack", "kind": "slack", "config": {"url_secret": "SLACK_URL"}},
        )
        assert made.status_code == 201
        assert slack.url not in made.text
        assert api.post("/api/v1/alerts/channels/slack/test").status_code == 200
        (message,) = slack.bodies()
        assert message["text"].startswith("*floom*: test alert to channel slack")


def test_a_patch_changes_only_the_settings_it_names_and_a_null_removes_one(
    tmp_path: Path, database_url: str
) -> None:
    # The host is checked by the egress guard when saved: a name of these tests' own,
    # resolved to loopback, which FAST allows.
    resolve = "mail.test=127.0.0.1"
    with (
        alert_server(tmp_path, database_url, agent_http_resolve=resolve) as srv,
        srv.client() as api,
    ):
        secrets.set_secret(srv.ctx, name="MAIL_PW", value="mail-password", caller=SYSTEM)
        mail = {
            "host": "mail.test",
            "sender": "floom@example.com",
            "to": ["ops@example.com"],
            "username": "floom",
            "password_secret": "MAIL_PW",
        }
        body = {"name": "mail", "kind": "email", "config": mail}
        assert api.post("/api/v1/alerts/channels", json=body).status_code == 201
        changed = api.patch("/api/v1/alerts/channels/mail", json={"config": {"port": 2525}})
        assert changed.status_code == 200, changed.text
        assert changed.json()["config"] == {**mail, "port": 2525, "starttls": True}

        refused = api.patch("/api/v1/alerts/channels/mail", json={"config": {"username": None}})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "alert_channel_invalid"
        unchanged = api.get("/api/v1/alerts/channels").json()["items"][0]["config"]
        assert unchanged == changed.json()["config"]  # a bad change changed nothing

        no_login = {"username": None, "password_secret": None}
        dropped = api.patch("/api/v1/alerts/channels/mail", json={"config": no_login})
        assert dropped.status_code == 200, dropped.text
        assert not {"username", "password_secret"} & set(dropped.json()["config"])
        assert dropped.json()["config"]["port"] == 2525

        assert (
            api.patch("/api/v1/alerts/channels/nope", json={"config": {"port": 25}}).status_code
            == 404
        )
        # PUT still replaces every setting.
        replaced = api.put("/api/v1/alerts/channels/mail", json={"config": mail})
        assert replaced.json()["config"]["port"] == 587


MARKUP_RUN = """\
import json
error = "<!channel> rotate your keys at <https://evil.example|https://floom.example/fix> & now"
json.dump({"error": error, "retryable": False}, open("result.json", "w"))
"""


def test_what_a_worker_writes_reaches_slack_as_text_never_as_a_mention_or_a_link(
    tmp_path: Path, database_url: str
) -> None:
    with receiver() as slack, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="SLACK_URL", value=slack.url, caller=SYSTEM)
        made = api.post(
            "/api/v1/alerts/channels",
            json={"name": "hook", "kind": "slack", "config": {"url_secret": "SLACK_URL"}},
        )
        assert made.status_code == 201, made.text
        deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": MARKUP_RUN}))
        run = api.post("/api/v1/workers/flaky/runs", json={"inputs": {"fail": True}}).json()
        assert wait_for_run(api, run["id"])["status"] == "failed"
        (message,) = slack.wait_for(1)
        text = message["text"]
        assert "<" not in text
        assert ">" not in text
        assert "&lt;!channel&gt; rotate your keys at &lt;https://evil.example|" in text
        assert "&amp; now" in text


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on loopback, on threads of its own; yields its origin."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def answering_without_end(size: int = 256 * 1024 * 1024) -> Iterator[tuple[str, dict[str, Any]]]:
    """A receiver that answers 200 with a body of `size` bytes (a stand-in for one that never
    ends), written until floom hangs up; `ended` says which came first."""
    ended: dict[str, Any] = {"cut": threading.Event(), "sent_all": threading.Event()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(size // len(chunk)):
                    self.wfile.write(chunk)
            except OSError:
                ended["cut"].set()
                return
            ended["sent_all"].set()

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as origin:
        yield f"{origin}/done", ended


def test_a_callback_receiver_that_answers_without_end_is_not_read(
    tmp_path: Path, database_url: str
) -> None:
    # Whoever starts a run names its callback's receiver. Only the answer's status counts:
    # floom hangs up after it, instead of holding the body in memory (and the alert loop on
    # it) for as long as the receiver goes on sending.
    with answering_without_end() as (url, ended), alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN}))
        run = api.post("/api/v1/workers/flaky/runs", json={"callback_url": url})
        assert run.status_code in (200, 201, 202), run.text
        wait_for_run(api, run.json()["id"])
        wait_until(
            lambda: [d for d in deliveries(api, purpose="callback") if d["status"] == "delivered"],
            timeout=60,
        )
        wait_until(lambda: ended["cut"].is_set() or ended["sent_all"].is_set(), timeout=60)
        assert ended["cut"].is_set()
        assert not ended["sent_all"].is_set()


@contextmanager
def answering_a_byte_at_a_time(pause: float = 0.25) -> Iterator[tuple[str, threading.Event]]:
    """A receiver that sends its answer's head one byte per `pause` (well within any read
    timeout), for minutes; the event is set when floom hangs up on it."""
    hung_up = threading.Event()
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"x" * 1000 + b"\r\n\r\n"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                for i in range(len(head)):
                    self.wfile.write(head[i : i + 1])
                    self.wfile.flush()
                    if hung_up.wait(pause):
                        return
            except OSError:
                hung_up.set()

        def log_message(self, *args: Any) -> None:
            pass

    try:
        with serving(Handler) as origin:
            yield f"{origin}/slow", hung_up
    finally:
        hung_up.set()


def test_a_callback_receiver_that_answers_a_byte_at_a_time_holds_up_nothing(
    tmp_path: Path, database_url: str
) -> None:
    # Each byte comes within the read timeout, so only a deadline on the whole send ends it;
    # without one the alert loop (every alert and callback of the node) waits for minutes.
    with (
        answering_a_byte_at_a_time() as (slow, _),
        receiver() as hook,
        alert_server(tmp_path / "d", database_url, alert_max_attempts=1) as srv,
    ):
        api = srv.client()
        deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN}))
        stuck = api.post("/api/v1/workers/flaky/runs", json={"callback_url": slow})
        wait_for_run(api, stuck.json()["id"])
        failed = wait_until(
            lambda: [d for d in deliveries(api, purpose="callback") if d["status"] == "failed"],
            timeout=30,
        )
        assert "did not answer within 2 s" in failed[0]["last_error"], failed
        good = api.post("/api/v1/workers/flaky/runs", json={"callback_url": hook.url})
        wait_for_run(api, good.json()["id"])
        hook.wait_for(1)


@contextmanager
def mail_server_saying_a_byte_at_a_time(
    pause: float = 0.25,
) -> Iterator[tuple[int, threading.Event]]:
    """A mail server that says its greeting one byte per `pause` (well within any read
    timeout), for minutes; the event is set when floom hangs up on it."""
    hung_up = threading.Event()
    greeting = b"220 " + b"x" * 1000 + b"\r\n"
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                try:
                    for i in range(len(greeting)):
                        conn.sendall(greeting[i : i + 1])
                        if hung_up.wait(pause):
                            return
                except OSError:
                    hung_up.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], hung_up
    finally:
        hung_up.set()
        listener.close()


def test_a_mail_server_that_speaks_a_byte_at_a_time_holds_up_nothing(
    tmp_path: Path, database_url: str
) -> None:
    # Each byte comes within the read timeout, so only a deadline on the whole exchange
    # ends it; without one the test send (and the alert loop) waits for minutes.
    with (
        mail_server_saying_a_byte_at_a_time() as (port, _),
        alert_server(tmp_path / "d", database_url, agent_http_resolve="mail.test=127.0.0.1") as srv,
        srv.client() as api,
    ):
        mail = {
            "host": "mail.test",
            "port": port,
            "starttls": False,
            "sender": "floom@example.com",
            "to": ["ops@example.com"],
        }
        body = {"name": "mail", "kind": "email", "config": mail}
        assert api.post("/api/v1/alerts/channels", json=body).status_code == 201
        sent = api.post("/api/v1/alerts/channels/mail/test", timeout=60)
        assert sent.status_code == 502, sent.text
        error = sent.json()["error"]
        assert error["code"] == "alert_undeliverable"
        assert "did not finish within 2 s (while connecting)" in error["message"], error


def test_a_callback_host_that_answers_when_checked_and_not_when_sent_holds_up_nothing(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its name resolves when the run starts, then its name server goes silent: the send is
    # refused within egress.RESOLVE_SECONDS, said in the delivery, and the alert loop goes
    # on to the next delivery instead of waiting out the resolver.
    silent = threading.Event()
    answer = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "cb.flip.test":
            if silent.is_set():
                answer.wait(60)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(egress, "RESOLVE_SECONDS", 0.3)
    try:
        with (
            receiver() as hook,
            alert_server(tmp_path / "d", database_url, alert_max_attempts=1) as srv,
        ):
            api = srv.client()
            deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN}))
            port = hook.url.split(":")[2].split("/")[0]
            flip = api.post(
                "/api/v1/workers/flaky/runs",
                json={"callback_url": f"http://cb.flip.test:{port}/done"},
            )
            assert flip.status_code in (200, 201, 202), flip.text
            silent.set()
            wait_for_run(api, flip.json()["id"])
            failed = wait_until(
                lambda: [d for d in deliveries(api, purpose="callback") if d["status"] == "failed"]
            )
            assert "no answer within 0.3 s" in failed[0]["last_error"], failed
            good = api.post("/api/v1/workers/flaky/runs", json={"callback_url": hook.url})
            wait_for_run(api, good.json()["id"])
            hook.wait_for(1)
    finally:
        answer.set()


def test_a_webhook_channels_path_and_query_are_shown_only_to_callers_who_may_change_it(
    tmp_path: Path, database_url: str
) -> None:
    # Many receivers take a token in the URL's path or query: a read key sees the origin.
    with receiver() as hook, alert_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        url = f"{hook.url}/T0K3N-in-the-path?token=in-the-query"
        add_webhook_channel(api, srv.ctx, url)
        assert api.post("/api/v1/alerts/channels/hook/test").status_code == 200
        hook.wait_for(1)
        origin = hook.url.split("/", 3)
        shown = f"{origin[0]}//{origin[2]}/…"

        (mine,) = api.get("/api/v1/alerts/channels").json()["items"]
        assert mine["config"]["url"] == url
        _, read_key = keys.create_key(srv.ctx, caller=SYSTEM, scopes=["read"], name="dash")
        reader = srv.client(read_key)
        (theirs,) = reader.get("/api/v1/alerts/channels").json()["items"]
        assert theirs["config"]["url"] == shown
        # A run's callback URL too: its delivery's target.
        deploy_folder(api, make_worker(tmp_path / "flaky", FLAKY, {"run.py": FLAKY_RUN}))
        run = api.post(
            "/api/v1/workers/flaky/runs", json={"inputs": {"fail": False}, "callback_url": url}
        ).json()
        wait_for_run(api, run["id"])
        hook.wait_for(2)
        (mine,) = deliveries(api, purpose="callback")
        assert mine["target"] == url.split("?")[0]  # the query is never shown
        (delivery,) = reader.get(
            "/api/v1/alerts/deliveries", params={"purpose": "callback"}
        ).json()["items"]
        assert delivery["target"] == shown
        assert reader.get(f"/api/v1/alerts/deliveries/{delivery['id']}").json()["target"] == shown
        page = signed_in_client(srv, read_key).get("/alerts").text
        assert "T0K3N" not in page
        assert "in-the-query" not in page
        assert "T0K3N" in signed_in_client(srv, srv.admin_key).get("/alerts").text
