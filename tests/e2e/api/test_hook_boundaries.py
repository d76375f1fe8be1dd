"""The boundary of /hooks against senders without the secret: one answer whether a hook is
there or not, a budget of failed signature checks per address and per hook, delivery ids
that stay spent when a worker is deleted and deployed again, and a Composio event fanned
out exactly once per worker even when the first attempt stopped partway."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlmodel import select
from standardwebhooks.webhooks import Webhook

from floom.services.ops.deliveries import KEY_GRACE
from floom.services.ops.retention import apply_retention
from floom.services.triggers import composio as composio_events
from floom.services.triggers import webhooks
from floom.store.db import session_scope
from floom.store.triggers import DeliveryTombstone, WebhookDelivery
from floom.triggers.signatures import sign_floom
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    dribbled_answer,
    live_server,
    make_worker,
    wait_for_run,
)

STANDARD_SECRET = "whsec_" + "Ym91bmRhcnktdGVzdC1zZWNyZXQtMDEyMzQ1Njc4OQ=="
OTHER_STANDARD = "whsec_" + "bm90LXRoZS1yaWdodC1zZWNyZXQtYXQtYWxsLTAx"
GITHUB_SECRET = "gh-boundary-secret"
HMAC_SECRET = "hmac-boundary-secret"
ECHO = """import json
inputs = json.load(open("inputs.json"))
json.dump({"outputs": {"event": inputs.get("event")}}, open("result.json", "w"))
"""


def post(server: LiveServer, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=60) as anonymous:
        return anonymous.post(path, content=body, headers=headers)


def standard(
    body: bytes, msg_id: str, secret: str, *, at: datetime | None = None
) -> dict[str, str]:
    when = at or datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body),
        "content-type": "application/json",
    }


def github(body: bytes, delivery: str, secret: str = GITHUB_SECRET) -> dict[str, str]:
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "push",
        "Content-Type": "application/json",
    }


def deploy_hook(api: httpx.Client, tmp_path: Path, name: str, trigger: str) -> None:
    manifest = f"name: {name}\ninputs: {{event: object}}\ntriggers:\n  - webhook: {trigger}\n"
    deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": ECHO}))


def deploy_every_kind(api: httpx.Client, tmp_path: Path) -> None:
    """A hook of each signature kind, and one whose secret is not set."""
    api.put("/api/v1/secrets/STD_SECRET", json={"value": STANDARD_SECRET})
    api.put("/api/v1/secrets/GH_SECRET", json={"value": GITHUB_SECRET})
    api.put("/api/v1/secrets/PLAIN_SECRET", json={"value": HMAC_SECRET})
    deploy_hook(api, tmp_path, "std", "{secret: STD_SECRET}")
    deploy_hook(api, tmp_path, "gh", "{signature: github, secret: GH_SECRET}")
    deploy_hook(api, tmp_path, "plain", "{signature: hmac-sha256, secret: PLAIN_SECRET}")
    deploy_hook(api, tmp_path, "unready", "{secret: NEVER_SET_SECRET}")


@pytest.fixture
def composio_server(tmp_path: Path, database_url: str) -> Iterator[LiveServer]:
    with live_server(
        tmp_path / "data", database_url, composio_webhook_secret=STANDARD_SECRET
    ) as srv:
        yield srv


@pytest.fixture
def unbudgeted(tmp_path: Path, database_url: str) -> Iterator[LiveServer]:
    """A server without a budget of failed checks: these tests fail many on purpose."""
    with live_server(
        tmp_path / "data",
        database_url,
        webhook_failures_per_minute=0,
        webhook_hook_failures_per_minute=0,
    ) as srv:
        yield srv


@contextmanager
def budgeted(
    tmp_path: Path, database_url: str, *, per_address: int, per_hook: int
) -> Iterator[LiveServer]:
    """A server with these budgets of failed checks, a hook of each kind deployed."""
    with live_server(
        tmp_path / "data",
        database_url,
        webhook_failures_per_minute=per_address,
        webhook_hook_failures_per_minute=per_hook,
    ) as srv:
        with srv.client() as api:
            deploy_every_kind(api, tmp_path)
        yield srv


# -- one answer, whether a hook is there or not -------------------------------------------------


def test_a_sender_without_the_secret_cannot_tell_a_hook_from_no_hook(
    unbudgeted: LiveServer, tmp_path: Path
) -> None:
    server = unbudgeted
    api = server.client()
    deploy_every_kind(api, tmp_path)
    body = b'{"action": "opened"}'
    now = int(time.time())
    stale = datetime.now(UTC) - timedelta(minutes=10)
    attempts = {
        "unsigned": {"content-type": "application/json"},
        "standard, wrong key": standard(body, "msg_1", OTHER_STANDARD),
        "standard, wrong key, stale": standard(body, "msg_2", OTHER_STANDARD, at=stale),
        "standard, malformed": {
            "webhook-id": "m",
            "webhook-timestamp": "not a time",
            "webhook-signature": "v1,AAAA",
        },
        "github, wrong key": github(body, "guid-1", "not-the-secret"),
        "hmac, wrong key": sign_floom(secret="not-the-secret", body=body, timestamp=now),
        "hmac, wrong key, stale": sign_floom(secret="nope", body=body, timestamp=now - 900),
    }
    hooks = ["/hooks/std", "/hooks/gh", "/hooks/plain", "/hooks/unready", "/hooks/nobody"]

    for what, headers in attempts.items():
        answers = {path: post(server, path, body, headers) for path in hooks}
        shown = {(a.status_code, a.text) for a in answers.values()}
        assert len(shown) == 1, (what, {p: (a.status_code, a.text) for p, a in answers.items()})
        (status, text) = shown.pop()
        assert status == 401, (what, text)
        code = json.loads(text)["error"]["code"]
        assert code == ("webhook_unsigned" if what == "unsigned" else "webhook_signature_invalid")

    for worker in ("std", "gh", "plain", "unready"):
        assert api.get(f"/api/v1/workers/{worker}/deliveries").json()["items"] == []


def test_a_sender_with_the_secret_still_hears_what_was_wrong(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_every_kind(api, tmp_path)
    body = b'{"action": "opened"}'
    stale = datetime.now(UTC) - timedelta(minutes=10)

    old_standard = post(server, "/hooks/std", body, standard(body, "m", STANDARD_SECRET, at=stale))
    old_plain = post(
        server,
        "/hooks/plain",
        body,
        sign_floom(secret=HMAC_SECRET, body=body, timestamp=int(time.time()) - 900),
    )
    fresh = post(server, "/hooks/gh", body, github(body, "guid-ok"))

    for answer in (old_standard, old_plain):
        assert (answer.status_code, answer.json()["error"]["code"]) == (401, "webhook_stale")
    assert fresh.status_code == 202, fresh.text


def test_composio_unset_and_composio_set_answer_a_forged_event_alike(
    server: LiveServer, composio_server: LiveServer
) -> None:
    body = json.dumps({"type": "composio.trigger.message"}).encode()
    for headers in ({}, standard(body, "msg_c", OTHER_STANDARD)):
        unset = post(server, "/hooks/composio", body, headers)
        configured = post(composio_server, "/hooks/composio", body, headers)
        assert unset.status_code == configured.status_code == 401
        assert unset.json() == configured.json()


# -- a budget of failed signature checks ----------------------------------------------------------


def test_failed_signature_checks_from_one_address_are_answered_429_before_any_work(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with budgeted(tmp_path, database_url, per_address=3, per_hook=0) as srv:
        body = b'{"n": 1}'
        forged = github(body, "guid-x", "not-the-secret")
        with caplog.at_level(logging.INFO, logger="floom"):
            # Spread over hooks, there and not there: the address's budget is one.
            failures = [
                post(srv, path, body, forged) for path in ("/hooks/gh", "/hooks/a", "/hooks/b")
            ]
            caplog.clear()
            flood = [post(srv, "/hooks/gh", body, forged) for _ in range(20)]
            # Past the budget, even a good delivery from the address waits.
            good = post(srv, "/hooks/gh", body, github(body, "guid-good"))

        assert [f.status_code for f in failures] == [401, 401, 401]
        for answer in [*flood, good]:
            assert answer.status_code == 429, answer.text
            assert answer.json()["error"]["code"] == "rate_limited"
            assert int(answer.headers["Retry-After"]) >= 1
            assert "FLOOM_" not in answer.text
        # No HMAC was computed nor refusal logged for the flood.
        assert "refused a delivery" not in caplog.text
        # Nor a body read: a body declared and not sent is answered 429 at once, not 408
        # after FLOOM_WEBHOOK_BODY_SECONDS.
        head, _ = dribbled_answer(srv.base_url, "/hooks/gh")
        assert head.startswith(b"HTTP/1.1 429"), head
        with srv.client() as api:
            assert api.get("/api/v1/workers/gh/deliveries").json()["items"] == []


def test_a_hooks_budget_is_spent_by_failures_at_it_alone_and_alike_for_absent_hooks(
    tmp_path: Path, database_url: str
) -> None:
    with budgeted(tmp_path, database_url, per_address=0, per_hook=2) as srv:
        body = b'{"n": 1}'
        forged = github(body, "guid-x", "not-the-secret")
        answers = {
            path: [post(srv, path, body, forged).status_code for _ in range(4)]
            for path in ("/hooks/gh", "/hooks/nobody")
        }
        other = post(srv, "/hooks/std", body, standard(body, "msg_ok", STANDARD_SECRET))

    assert answers == {"/hooks/gh": [401, 401, 429, 429], "/hooks/nobody": [401, 401, 429, 429]}
    assert other.status_code == 202, other.text


def post_from(
    server: LiveServer, address: str, path: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    """A delivery sent from `address` (any of 127.0.0.0/8 reaches a loopback server)."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(base_url=server.base_url, timeout=60, transport=transport) as sender:
        return sender.post(path, content=body, headers=headers)


def test_a_flood_at_a_hook_from_many_addresses_does_not_hold_back_its_verified_sender(
    tmp_path: Path, database_url: str
) -> None:
    with budgeted(tmp_path, database_url, per_address=0, per_hook=3) as srv:
        body = b'{"n": 1}'
        sender, newcomer = "127.0.0.2", "127.0.0.3"
        first = post_from(srv, sender, "/hooks/gh", body, github(body, "guid-1"))
        flood = [
            post_from(srv, f"127.0.1.{n}", "/hooks/gh", body, github(body, f"f{n}", "forged"))
            for n in range(1, 7)
        ]
        # Each event its own body: a repeated signature is a duplicate whatever its id.
        again, other = b'{"n": 2}', b'{"n": 3}'
        known = post_from(srv, sender, "/hooks/gh", again, github(again, "guid-2"))
        new = post_from(srv, newcomer, "/hooks/gh", other, github(other, "guid-3"))
        with srv.client() as api:
            delivered = api.get("/api/v1/workers/gh/deliveries").json()["items"]

    assert first.status_code == 202, first.text
    assert [f.status_code for f in flood] == [401, 401, 401, 429, 429, 429]
    # The address that delivered a verified event is still heard; a new one waits.
    assert known.status_code == 202, known.text
    assert new.status_code == 429, new.text
    assert sorted(d["delivery_id"] for d in delivered) == ["guid-1", "guid-2"]


# -- delivery ids stay spent ---------------------------------------------------------------


def test_a_github_delivery_is_not_run_again_by_a_worker_deployed_again_under_the_name(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/GH_SECRET", json={"value": GITHUB_SECRET})
    deploy_hook(api, tmp_path, "gh", "{signature: github, secret: GH_SECRET}")
    body = b'{"ref": "refs/heads/main"}'
    first = post(server, "/hooks/gh", body, github(body, "guid-1"))
    assert first.status_code == 202, first.text
    wait_for_run(api, first.json()["run_id"])

    deleted = api.delete("/api/v1/workers/gh")
    assert deleted.status_code == 200, deleted.text
    deploy_hook(api, tmp_path, "gh", "{signature: github, secret: GH_SECRET}")

    # The captured request, as it was and under a new delivery id (GitHub signs none).
    replayed = post(server, "/hooks/gh", body, github(body, "guid-1"))
    renamed = post(server, "/hooks/gh", body, github(body, "guid-2"))
    fresh_body = b'{"ref": "refs/heads/next"}'
    fresh = post(server, "/hooks/gh", fresh_body, github(fresh_body, "guid-3"))

    for answer in (replayed, renamed):
        assert answer.status_code == 200, answer.text
        assert answer.json()["duplicate"] is True
        assert answer.json()["run_id"] == first.json()["run_id"]
    assert fresh.status_code == 202, fresh.text
    runs = api.get("/api/v1/runs", params={"worker": "gh"}).json()["items"]
    assert {r["id"] for r in runs} == {first.json()["run_id"], fresh.json()["run_id"]}
    # Deleted again: the tombstones are kept once, not refused as duplicates of themselves.
    assert api.delete("/api/v1/workers/gh").status_code == 200


def test_a_deleted_workers_timestamped_delivery_keys_expire_and_github_s_stay(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_every_kind(api, tmp_path)
    body = b'{"ref": "refs/heads/main"}'
    signed = sign_floom(secret=HMAC_SECRET, body=body, timestamp=int(time.time()))
    sent = {
        "std": post(server, "/hooks/std", body, standard(body, "msg_1", STANDARD_SECRET)),
        "plain": post(server, "/hooks/plain", body, {**signed, "Content-Type": "application/json"}),
        "gh": post(server, "/hooks/gh", body, github(body, "guid-1")),
    }
    # One stored before floom kept a delivery's scheme: its trigger, unchanged since, says.
    with session_scope(server.ctx.engine, write=True) as s:
        s.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.worker_name == "std")  # type: ignore[arg-type]
            .values(signature=None)
        )
    for name, answer in sent.items():
        assert answer.status_code == 202, (name, answer.text)
        wait_for_run(api, answer.json()["run_id"])
        assert api.delete(f"/api/v1/workers/{name}").status_code == 200
    deploy_hook(api, tmp_path, "std", "{secret: STD_SECRET}")

    # Within the expiry, the sender's retry of the same message (signed afresh) is refused.
    again = post(server, "/hooks/std", body, standard(body, "msg_1", STANDARD_SECRET))
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    now = datetime.now(UTC)
    assert apply_retention(server.ctx, days=0, now=now).delivery_tombstones_deleted == 0
    assert _buried(server) == ["gh", "gh", "plain", "std"]  # GitHub's digest is kept too

    # Past it, no signature of those deliveries can verify, and retention prunes them.
    later = now + KEY_GRACE + timedelta(minutes=1)
    report = apply_retention(server.ctx, days=0, now=later)
    assert report.delivery_tombstones_deleted == 2, report
    # GitHub signs no timestamp: its captured request verifies for as long as its secret
    # stands, so its keys stay.
    assert _buried(server) == ["gh", "gh"]


@pytest.mark.parametrize(
    "gone_by",
    ["retention", "deletion", "retention of an older row", "deletion of an older row"],
)
def test_a_github_delivery_stays_spent_after_its_hook_signs_with_a_timestamped_scheme(
    server: LiveServer, api: httpx.Client, tmp_path: Path, gone_by: str
) -> None:
    # A worker has one webhook trigger whatever its scheme: a redeploy that changes the
    # scheme keeps the row. The deliveries GitHub signed before must stay spent for as long
    # as GitHub's signature verifies, which the hook's later scheme does not decide.
    api.put("/api/v1/secrets/GH_SECRET", json={"value": GITHUB_SECRET})
    api.put("/api/v1/secrets/PLAIN_SECRET", json={"value": HMAC_SECRET})
    deploy_hook(api, tmp_path, "gh", "{signature: github, secret: GH_SECRET}")
    body = b'{"ref": "refs/heads/main"}'
    first = post(server, "/hooks/gh", body, github(body, "guid-1"))
    assert first.status_code == 202, first.text
    wait_for_run(api, first.json()["run_id"])
    if gone_by.endswith("of an older row"):  # stored before the scheme was kept with it
        with session_scope(server.ctx.engine, write=True) as s:
            s.execute(update(WebhookDelivery).values(signature=None))
    deploy_hook(api, tmp_path, "gh", "{signature: hmac-sha256, secret: PLAIN_SECRET}")
    if gone_by.startswith("deletion"):
        assert api.delete("/api/v1/workers/gh").status_code == 200
    later = datetime.now(UTC) + KEY_GRACE + timedelta(days=2)
    apply_retention(server.ctx, days=1, now=later)

    # Back to GitHub with its secret (a rollback, or the worker deployed again).
    deploy_hook(api, tmp_path, "gh", "{signature: github, secret: GH_SECRET}")
    replayed = post(server, "/hooks/gh", body, github(body, "guid-1"))
    renamed = post(server, "/hooks/gh", body, github(body, "guid-2"))
    for answer in (replayed, renamed):
        assert answer.status_code == 200, answer.text
        assert answer.json()["duplicate"] is True


def _buried(server: LiveServer) -> list[str]:
    with session_scope(server.ctx.engine) as s:
        return sorted(s.exec(select(DeliveryTombstone.worker_name)).all())


# -- a Composio event fanned out exactly once per worker ------------------------------------------


def composio_event(msg_id: str) -> tuple[bytes, dict[str, str]]:
    payload = {
        "id": msg_id,
        "type": "composio.trigger.message",
        "timestamp": "2026-01-15T11:00:00Z",
        "metadata": {"trigger_slug": "GITHUB_COMMIT_EVENT", "connected_account_id": "ca_1"},
        "data": {"repo": "acme/api"},
    }
    body = json.dumps(payload).encode()
    return body, standard(body, msg_id, STANDARD_SECRET)


def test_a_composio_event_cut_short_runs_the_workers_it_missed_when_sent_again(
    composio_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with composio_server.client() as api:
        for name in ("alpha", "bravo", "charlie"):
            manifest = (
                f"name: {name}\ninputs: {{event: object}}\n"
                "triggers:\n  - composio: {event: GITHUB_COMMIT_EVENT}\n"
            )
            deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": ECHO}))
        real = webhooks.deliver

        def crashing(ctx: Any, **kw: Any) -> Any:
            if kw["worker"].name == "bravo":  # the node dies before bravo's run
                raise RuntimeError("the node went down")
            return real(ctx, **kw)

        monkeypatch.setattr(composio_events, "deliver", crashing)
        body, headers = composio_event("msg_crash")
        cut = post(composio_server, "/hooks/composio", body, headers)
        assert cut.status_code == 500
        monkeypatch.setattr(composio_events, "deliver", real)

        again = post(composio_server, "/hooks/composio", body, headers)
        once_more = post(composio_server, "/hooks/composio", body, headers)

        assert again.status_code == 202, again.text
        fired = {d["worker"]: d for d in again.json()["deliveries"]}
        assert {w: d["duplicate"] for w, d in fired.items()} == {
            "alpha": True,
            "bravo": False,
            "charlie": False,
        }
        assert once_more.status_code == 200
        assert once_more.json()["duplicate"] is True
        for name in ("alpha", "bravo", "charlie"):
            runs = api.get("/api/v1/runs", params={"worker": name}).json()["items"]
            assert len(runs) == 1, (name, runs)
            assert wait_for_run(api, runs[0]["id"])["status"] == "succeeded"
