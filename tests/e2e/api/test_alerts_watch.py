"""The alert watch's dead-man's switch and its refusals: a schedule whose ticks stop running
is missed, late or stuck, then recovers; bad channels, rules, worker.yml alerts and callback
URLs are refused naming the field, and change nothing."""

from __future__ import annotations

import base64
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event as sa_event
from sqlmodel import select
from standardwebhooks.webhooks import Webhook

from floom.net import egress
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.alerts import deliveries as delivery_service
from floom.services.alerts import incidents
from floom.services.alerts.watch import watch_schedules
from floom.services.triggers.schedules import fire_due
from floom.store.db import session_scope
from floom.store.models import AlertChannel, AlertEvent, AlertRule, Run, utcnow
from floom.store.triggers import Trigger
from floom.triggers import cron
from floom.vocabulary import RunStatus
from tests.support.harness import LiveServer, deploy_folder, live_server, make_worker, wait_until
from tests.support.rigs.alerts import receiver

KEY = "whsec_" + base64.b64encode(b"w" * 32).decode()
GRACE = 5.0
STUCK = 30.0
SCHEDULED = """\
name: nightly
triggers:
  - schedule: {cron: "* * * * *"}
alerts:
  - events: [schedule.*]
    channels: [hook]
"""


def _hook_channel(srv: LiveServer, url: str) -> None:
    secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY, caller=SYSTEM)
    resp = srv.client().post(
        "/api/v1/alerts/channels",
        json={"name": "hook", "kind": "webhook", "config": {"url": url, "secret": "HOOK_KEY"}},
    )
    assert resp.status_code == 201, resp.text


def _first_tick(srv: LiveServer) -> tuple[Trigger, Any]:
    with session_scope(srv.ctx.engine) as s:
        trigger = s.exec(select(Trigger).where(Trigger.worker_name == "nightly")).one()
    (tick,) = cron.next_fire_times("* * * * *", cron.zone("UTC"), after=trigger.created_at, count=1)
    return trigger, tick


def _sent(srv: LiveServer) -> list[str]:
    delivery_service.deliver_due(srv.ctx)
    page = srv.client().get("/api/v1/alerts/deliveries", params={"purpose": "alert"}).json()
    return [d["type"] for d in reversed(page["items"]) if d["status"] == "delivered"]


def test_a_schedule_whose_ticks_stop_running_is_missed_then_recovers(
    tmp_path: Path, database_url: str
) -> None:
    # No scheduler role: nothing fires the ticks, as when the scheduler is down.
    with (
        receiver() as hook,
        live_server(
            tmp_path / "d",
            database_url,
            roles="api,executor",
            agent_http_allow_private=True,
            alert_schedule_grace_seconds=GRACE,
            alert_poll_seconds=3600,  # the node's watch looks once at start; the test drives it
        ) as srv,
    ):
        _hook_channel(srv, hook.url)
        deploy_folder(srv.client(), make_worker(tmp_path / "w", SCHEDULED, {"run.py": "pass\n"}))
        trigger, tick = _first_tick(srv)
        # Within the grace time nothing is wrong yet.
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=GRACE - 1)) == 0
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=GRACE + 1)) == 1
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=GRACE + 2)) == 0  # once
        assert _sent(srv) == ["schedule.missed"]
        missed = hook.bodies()[0]
        assert missed["incident"]["status"] == "open"
        assert missed["details"]["scheduled_for"] == tick.isoformat()
        # The scheduler is back: the tick runs (on this node's executor) and succeeds.
        fire_due(srv.ctx, now=tick + timedelta(seconds=GRACE + 3))
        with session_scope(srv.ctx.engine) as s:
            run_id = s.exec(select(Run.id).where(Run.trigger_id == trigger.id)).one()
        wait_until(
            lambda: srv.client().get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded"
        )
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=GRACE + 4)) == 1
        assert _sent(srv) == ["schedule.missed", "recovered"]
        assert hook.bodies()[1]["incident"]["events"] == 1


def test_a_schedules_run_that_does_not_start_is_late_and_one_that_does_not_end_is_stuck(
    tmp_path: Path, database_url: str
) -> None:
    worker = SCHEDULED.replace("alerts:", "inputs:\n  wait: {type: number, default: 0}\nalerts:")
    with (
        receiver() as hook,
        live_server(
            tmp_path / "d",
            database_url,
            roles="api",  # no executor either: the fired run stays queued
            agent_http_allow_private=True,
            alert_schedule_grace_seconds=GRACE,
            alert_poll_seconds=3600,  # the node's watch looks once at start; the test drives it
            alert_schedule_stuck_seconds=STUCK,
        ) as srv,
    ):
        _hook_channel(srv, hook.url)
        deploy_folder(srv.client(), make_worker(tmp_path / "w", worker, {"run.py": "pass\n"}))
        trigger, tick = _first_tick(srv)
        fire_due(srv.ctx, now=tick + timedelta(seconds=1))
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=GRACE + 1)) == 1
        assert _sent(srv) == ["schedule.late"]
        with session_scope(srv.ctx.engine, write=True) as s:
            run = s.exec(select(Run).where(Run.trigger_id == trigger.id)).one()
            run.status = RunStatus.RUNNING  # as a node that took it and hangs would leave it
            s.add(run)
        assert watch_schedules(srv.ctx, now=tick + timedelta(seconds=STUCK + 1)) == 1
        with session_scope(srv.ctx.engine) as s:
            kinds = s.exec(select(AlertEvent.kind, AlertEvent.outcome)).all()
        # One incident: the stuck run is grouped into the late one, and sends nothing more.
        assert sorted(kinds) == [("schedule.late", "opened"), ("schedule.stuck", "grouped")]
        assert _sent(srv) == ["schedule.late"]


def _count(srv: LiveServer, table: Any) -> int:
    with session_scope(srv.ctx.engine) as s:
        return len(s.exec(select(table)).all())


def _refused(resp: httpx.Response, code: str, path: str) -> dict[str, Any]:
    assert resp.status_code == 422, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["code"] == code
    assert path in [d["path"] for d in error["details"]], error
    assert path.split("[")[0].split(".")[-1] in error["message"]
    return error


def test_a_url_python_cannot_split_is_refused_naming_the_field_on_every_path(
    tmp_path: Path, database_url: str
) -> None:
    # "http://[::1": a bracket never closed makes urlsplit raise, where a URL is checked for a
    # channel (added, replaced, changed), a run's callback and a worker.yml's trigger callback.
    unsplit = "http://[::1/hook"
    with live_server(
        tmp_path / "d", database_url, agent_http_resolve="example.com=93.184.215.14"
    ) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY, caller=SYSTEM)
        channels = "/api/v1/alerts/channels"
        good = {"url": "https://example.com/hook", "secret": "HOOK_KEY"}
        resp = api.post(channels, json={"name": "hook", "kind": "webhook", "config": good})
        assert resp.status_code == 201, resp.text
        bad = {**good, "url": unsplit}
        for resp in (
            api.post(channels, json={"name": "other", "kind": "webhook", "config": bad}),
            api.put(f"{channels}/hook", json={"config": bad}),
            api.patch(f"{channels}/hook", json={"config": {"url": unsplit}}),
        ):
            error = _refused(resp, "alert_channel_invalid", "config.url")
            assert "not an http(s) URL" in error["message"]
        assert [c["config"] for c in api.get(channels).json()["items"]] == [good]
        folder = make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"})
        deploy_folder(api, folder)
        resp = api.post("/api/v1/workers/w/runs", json={"callback_url": unsplit})
        _refused(resp, "input_invalid", "callback_url")
        assert _count(srv, Run) == 0
        (folder / "worker.yml").write_text(
            "name: w\ninputs: {event: object}\n"
            f"triggers:\n  - composio: {{event: X, callback_url: '{unsplit}'}}\n"
        )
        from floom.bundle import read_folder

        archive = read_folder(folder, max_bytes=1 << 20).to_archive()
        gzip = {"Content-Type": "application/gzip"}
        checked = api.post("/api/v1/workers/validate", content=archive, headers=gzip)
        assert checked.status_code == 200, checked.text
        paths = [p["path"] for p in checked.json()["problems"]]
        assert paths == ["triggers[0].composio.callback_url"]
        resp = api.post("/api/v1/workers", content=archive, headers=gzip)
        assert resp.status_code == 400, resp.text
        assert len(api.get("/api/v1/workers/w/versions").json()["items"]) == 1


def test_a_channel_change_naming_what_it_cannot_change_is_refused_not_ignored(
    tmp_path: Path, database_url: str
) -> None:
    # A PATCH answered 200 for a kind it did not change, or for removing a setting the kind
    # does not have (a misspelt one): the caller was told it was done.
    with live_server(
        tmp_path / "d", database_url, agent_http_resolve="example.com=93.184.215.14"
    ) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY, caller=SYSTEM)
        channels = "/api/v1/alerts/channels"
        good = {"url": "https://example.com/hook", "secret": "HOOK_KEY"}
        resp = api.post(channels, json={"name": "hook", "kind": "webhook", "config": good})
        assert resp.status_code == 201, resp.text
        moved = {"url": "https://example.com/moved"}
        resp = api.patch(f"{channels}/hook", json={"kind": "slack", "config": moved})
        assert resp.status_code == 422, resp.text
        assert "kind" in resp.json()["error"]["message"]
        for change in ({"secert": None}, {"url_secret": None, **moved}):
            resp = api.patch(f"{channels}/hook", json={"config": change})
            key = next(iter(change))
            error = _refused(resp, "alert_channel_invalid", f"config.{key}")
            assert "unknown setting for a webhook channel" in error["message"]
        assert [c["config"] for c in api.get(channels).json()["items"]] == [good]


def test_bad_channels_rules_and_callback_urls_are_refused_naming_the_field(
    tmp_path: Path, database_url: str
) -> None:
    # The egress guard as shipped (no loopback, no private ranges); example.com resolves to
    # a public address without asking DNS.
    with live_server(
        tmp_path / "d", database_url, agent_http_resolve="example.com=93.184.215.14"
    ) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY, caller=SYSTEM)
        secrets.set_secret(srv.ctx, name="NOT_A_KEY", value="plain text", caller=SYSTEM)
        channels = "/api/v1/alerts/channels"

        def add(config: dict[str, Any], kind: str = "webhook") -> httpx.Response:
            return api.post(channels, json={"name": "hook", "kind": kind, "config": config})

        error = _refused(
            add({"url": "http://127.0.0.1:9/x", "secret": "HOOK_KEY"}),
            "alert_channel_invalid",
            "config.url",
        )
        assert "loopback" in error["message"]
        _refused(
            add({"url": "http://10.0.0.5/x", "secret": "HOOK_KEY"}),
            "alert_channel_invalid",
            "config.url",
        )
        _refused(
            add({"url": "ftp://example.com/x", "secret": "HOOK_KEY"}),
            "alert_channel_invalid",
            "config.url",
        )
        _refused(
            add({"url": "https://example.com/x", "secret": "MISSING"}),
            "alert_channel_invalid",
            "config.secret",
        )
        _refused(
            add({"url": "https://example.com/x", "secret": "NOT_A_KEY"}),
            "alert_channel_invalid",
            "config.secret",
        )
        _refused(
            add({"url": "https://example.com/x", "secret": "HOOK_KEY", "x": 1}),
            "alert_channel_invalid",
            "config.x",
        )
        _refused(
            add({"url_secret": "HOOK_KEY"}, kind="slack"),
            "alert_channel_invalid",
            "config.url_secret",
        )
        mail = {"host": "smtp.example.com", "sender": "floom@example.com", "to": ["not an address"]}
        _refused(add(mail, kind="email"), "alert_channel_invalid", "config.to[0]")
        _refused(
            add({**mail, "to": ["a@example.com"], "username": "u"}, kind="email"),
            "alert_channel_invalid",
            "config.password_secret",
        )
        assert _count(srv, AlertChannel) == 0

        rules = "/api/v1/alerts/rules"
        _refused(
            api.post(rules, json={"name": "r", "events": ["run.fialed"], "channels": ["x"]}),
            "alert_rule_invalid",
            "events[0]",
        )
        _refused(
            api.post(rules, json={"name": "r", "events": ["run.failed"], "channels": ["ops"]}),
            "alert_rule_invalid",
            "channels[0]",
        )
        _refused(
            api.post(rules, json={"name": "R!", "events": ["run.failed"], "channels": ["ops"]}),
            "alert_rule_invalid",
            "name",
        )
        assert _count(srv, AlertRule) == 0

        folder = make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"})
        deploy_folder(api, folder)
        for url, words in (
            ("http://127.0.0.1:9/done", "loopback"),
            ("http://169.254.169.254/latest", "link-local"),
            ("file:///etc/passwd", "not an http(s) URL"),
            ("https://user:pw@example.com/x", "password"),
        ):
            resp = api.post("/api/v1/workers/w/runs", json={"callback_url": url})
            error = _refused(resp, "input_invalid", "callback_url")
            assert words in error["message"], error
        assert _count(srv, Run) == 0

        bad = "name: w\nalerts:\n  - events: [node.lost, nope]\n    channels: [Ops]\n"
        (folder / "worker.yml").write_text(bad)
        from floom.bundle import read_folder

        archive = read_folder(folder, max_bytes=1 << 20).to_archive()
        resp = api.post(
            "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
        )
        assert resp.status_code == 400, resp.text
        paths = {d["path"] for d in resp.json()["error"]["details"]}
        assert {"alerts[0].events[0]", "alerts[0].events[1]", "alerts[0].channels[0]"} <= paths
        assert len(api.get("/api/v1/workers/w/versions").json()["items"]) == 1


def test_an_email_channel_s_host_is_checked_by_the_egress_guard_when_saved(
    tmp_path: Path, database_url: str
) -> None:
    # As a webhook's URL is: a mail host on loopback, a private or link-local (cloud
    # metadata) address, or a name that does not resolve is refused on add and on update,
    # naming config.host, and changes nothing; not first when an alert is sent.
    resolve = "mail.example.com=93.184.215.14,metadata.example.com=169.254.169.254"
    with live_server(tmp_path / "d", database_url, agent_http_resolve=resolve) as srv:
        api = srv.client()
        channels = "/api/v1/alerts/channels"
        mail = {"sender": "floom@example.com", "to": ["ops@example.com"], "starttls": False}
        for host, words in (
            ("127.0.0.1", "loopback"),
            ("localhost", "loopback"),
            ("10.0.0.5", "private"),
            ("metadata.example.com", "link-local"),
            ("smtp.nowhere.invalid", "cannot resolve"),
        ):
            resp = api.post(
                channels, json={"name": "mail", "kind": "email", "config": {**mail, "host": host}}
            )
            error = _refused(resp, "alert_channel_invalid", "config.host")
            assert words in error["message"], error
        assert _count(srv, AlertChannel) == 0
        good = {**mail, "host": "mail.example.com", "port": 25}
        resp = api.post(channels, json={"name": "mail", "kind": "email", "config": good})
        assert resp.status_code == 201, resp.text
        resp = api.put(f"{channels}/mail", json={"config": {**good, "host": "127.0.0.1"}})
        _refused(resp, "alert_channel_invalid", "config.host")
        (kept,) = api.get(channels).json()["items"]
        assert kept["config"]["host"] == "mail.example.com"


def test_a_callback_host_that_never_resolves_is_refused_in_bounded_time_and_hosts_are_capped(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name whose server never answers would hold a server thread for as long as the
    # resolver waits, once per request (a run key's callback_url) or per trigger (any read
    # key's validate): each is given egress.RESOLVE_SECONDS, and a worker.yml's callback
    # URLs name at most MAX_CALLBACK_HOSTS hosts, each resolved once.
    answer = threading.Event()
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host.endswith(".slow.test"):
            asked.append(host)
            answer.wait(30)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(egress, "RESOLVE_SECONDS", 0.3)
    hosts = ",".join(f"h{i}.example.com=93.184.215.14" for i in range(12))
    try:
        with live_server(tmp_path / "d", database_url, agent_http_resolve=hosts) as srv:
            api = srv.client()
            deploy_folder(api, make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"}))
            resp = api.post(
                "/api/v1/workers/w/runs", json={"callback_url": "https://never.slow.test/done"}
            )
            error = _refused(resp, "input_invalid", "callback_url")
            assert "no answer within 0.3 s" in error["message"], error
            assert _count(srv, Run) == 0

            triggers = "".join(
                f"  - composio: {{event: E{i}, callback_url: 'https://h{i % 11}.example.com/x'}}\n"
                for i in range(15)
            ) + "".join(
                f"  - composio: {{event: S{i}, callback_url: 'https://a.slow.test/x'}}\n"
                for i in range(3)
            )
            manifest = f"name: c\ninputs:\n  event: {{type: object}}\ntriggers:\n{triggers}"
            folder = make_worker(tmp_path / "c", manifest, {"run.py": "pass\n"})
            from floom.bundle import read_folder

            archive = read_folder(folder, max_bytes=1 << 20).to_archive()
            resp = api.post(
                "/api/v1/workers/validate",
                content=archive,
                headers={"Content-Type": "application/gzip"},
            )
            assert resp.status_code == 200, resp.text
            problems = {p["path"]: p["message"] for p in resp.json()["problems"]}
            too_many = [p for p, m in problems.items() if "one host too many" in m]
            # h10 (trigger 10) is the eleventh host; triggers 11 to 14 name hosts asked
            # already; the slow host is a twelfth.
            assert too_many == ["triggers[10].composio.callback_url"] + [
                f"triggers[{i}].composio.callback_url" for i in range(15, 18)
            ], problems
            assert asked == ["never.slow.test"], asked  # a.slow.test, over the cap: never asked
    finally:
        answer.set()


def test_a_channel_s_fields_of_any_size_or_type_are_refused_naming_them_never_a_500(
    tmp_path: Path, database_url: str
) -> None:
    resolve = "mail.example.com=93.184.215.14"
    with live_server(tmp_path / "d", database_url, agent_http_resolve=resolve) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="X", value="mail-password", caller=SYSTEM)
        channels = "/api/v1/alerts/channels"
        mail: dict[str, Any] = {
            "host": "mail.example.com",
            "sender": "floom@example.com",
            "to": ["ops@example.com"],
        }
        nested = "(" * 5000  # the address parser recurses once per "("
        for path, config in (
            ("config.sender", {**mail, "sender": nested}),
            ("config.to[1]", {**mail, "to": ["ops@example.com", nested]}),
            ("config.sender", {**mail, "sender": "<" * 100_000}),
            ("config.sender", {**mail, "sender": "a" * 300 + "@example.com"}),
            ("config.sender", {**mail, "sender": 7}),
            ("config.to[0]", {**mail, "to": [{"a": 1}]}),
            ("config.to", {**mail, "to": {"a": 1}}),
            ("config.to", {**mail, "to": ["ops@example.com"] * 21}),
            ("config.host", {**mail, "host": "h" * 10_000}),
            ("config.host", {**mail, "host": ["mail.example.com"]}),
            ("config.port", {**mail, "port": "25"}),
            ("config.port", {**mail, "port": 2**70}),
            ("config.username", {**mail, "username": {"a": 1}, "password_secret": "X"}),
        ):
            resp = api.post(channels, json={"name": "mail", "kind": "email", "config": config})
            assert resp.status_code == 422, (path, resp.status_code, resp.text[:300])
            assert resp.json()["error"]["code"] == "alert_channel_invalid"
            assert path in [d["path"] for d in resp.json()["error"]["details"]], (path, resp.text)
        for name in ("n" * 10_000, 7, None, ["a"]):
            resp = api.post(channels, json={"name": name, "kind": "email", "config": mail})
            assert resp.status_code in (400, 422), (name, resp.text[:300])
        assert _count(srv, AlertChannel) == 0


def test_a_slack_channel_s_url_secret_is_never_quoted_when_refused_or_failing(
    tmp_path: Path, database_url: str
) -> None:
    # A deploy key may name any secret as a Slack channel's URL; a refusal that quoted the
    # value (or its host) would read any secret back. Nor does a failed send's error, which
    # every read key sees, quote the host of the URL the secret holds.
    resolve = "hooks.example.com=93.184.215.14"
    with live_server(tmp_path / "d", database_url, agent_http_resolve=resolve) as srv:
        api = srv.client()
        channels = "/api/v1/alerts/channels"
        for value in (
            "hunter2-a-database-password",
            "https://private-name-of-a-host.invalid/T0/B0/token",
            "gopher://hunter3-inside-a-url/x",
            "http://127.0.0.1:9/hunter4",
        ):
            secrets.set_secret(srv.ctx, name="DB_PASSWORD", value=value, caller=SYSTEM)
            resp = api.post(
                channels,
                json={"name": "s", "kind": "slack", "config": {"url_secret": "DB_PASSWORD"}},
            )
            _refused(resp, "alert_channel_invalid", "config.url_secret")
            for part in ("hunter", "private-name", "127.0.0.1"):
                assert part not in resp.text, resp.text
        assert _count(srv, AlertChannel) == 0

        hook = "https://hooks.example.com/services/T0/B0/x"
        secrets.set_secret(srv.ctx, name="SLACK_URL", value=hook, caller=SYSTEM)
        resp = api.post(
            channels, json={"name": "s", "kind": "slack", "config": {"url_secret": "SLACK_URL"}}
        )
        assert resp.status_code == 201, resp.text
        moved = "https://hidden-host-name.invalid/x"
        secrets.set_secret(srv.ctx, name="SLACK_URL", value=moved, caller=SYSTEM)
        resp = api.post(f"{channels}/s/test")
        assert resp.status_code == 502, resp.text
        assert "hidden-host-name" not in resp.text
        assert "secret SLACK_URL" in resp.json()["error"]["message"]
        listed = api.get("/api/v1/alerts/deliveries").text
        assert "hidden-host-name" not in listed


def test_a_secret_cut_through_at_an_alert_message_s_bound_leaves_none_of_its_characters(
    tmp_path: Path, database_url: str
) -> None:
    secret = "tok-0123456789-abcdef"
    with live_server(tmp_path / "d", database_url) as srv:
        api = srv.client()
        secrets.set_secret(srv.ctx, name="TOKEN", value=secret, caller=SYSTEM)
        deploy_folder(
            api, make_worker(tmp_path / "w", "name: w\nsecrets: [TOKEN]\n", {"run.py": "pass\n"})
        )
        for shift in (3, 10, len(secret) - 1):
            message = "x" * (incidents.MAX_MESSAGE - shift) + secret + " and more"
            event = incidents.record(
                srv.ctx,
                incidents.Seen(
                    key=f"probe:{shift}",
                    kind="run.failed",
                    subject=f"probe:{shift}",
                    what=incidents.PROBLEM,
                    summary="probe",
                    at=utcnow(),
                    worker="w",
                    message=message,
                ),
            )
            assert event is not None
            assert event.message is not None
            kept = event.message
            assert len(kept) <= incidents.MAX_MESSAGE + len("***")
            assert secret[:3] not in kept, (shift, kept[-40:])
            assert "***" in kept[-40:], (shift, kept[-40:])


def test_recording_an_alert_with_secrets_to_mask_holds_one_database_connection(
    tmp_path: Path, database_url: str
) -> None:
    # Its write transaction holds the SQLite write lock: a second connection for the
    # secrets waited on the pool (or, on SQLite, on that very lock) while every writer
    # waited on it.
    with live_server(tmp_path / "d", database_url) as srv:
        secrets.set_secret(srv.ctx, name="TOKEN", value="tok-0123456789", caller=SYSTEM)
        deploy_folder(
            srv.client(),
            make_worker(tmp_path / "w", "name: w\nsecrets: [TOKEN]\n", {"run.py": "pass\n"}),
        )
        me = threading.get_ident()
        held, most = [0], [0]

        def out(*_: Any) -> None:
            if threading.get_ident() == me:
                held[0] += 1
                most[0] = max(most[0], held[0])

        def back(*_: Any) -> None:
            if threading.get_ident() == me:
                held[0] -= 1

        sa_event.listen(srv.ctx.engine, "checkout", out)
        sa_event.listen(srv.ctx.engine, "checkin", back)
        try:
            recorded = incidents.record(
                srv.ctx,
                incidents.Seen(
                    key="probe",
                    kind="run.failed",
                    subject="probe",
                    what=incidents.PROBLEM,
                    summary="probe",
                    at=utcnow(),
                    worker="w",
                    message="failed with tok-0123456789",
                ),
            )
        finally:
            sa_event.remove(srv.ctx.engine, "checkout", out)
            sa_event.remove(srv.ctx.engine, "checkin", back)
        assert recorded is not None
        assert recorded.message == "failed with ***"
        assert most[0] == 1


def test_a_test_send_to_an_unreachable_channel_says_why(tmp_path: Path, database_url: str) -> None:
    with receiver() as hook:
        url = hook.url  # closed again below: nothing listens there any more
    with live_server(tmp_path / "d", database_url, agent_http_allow_private=True) as srv:
        _hook_channel(srv, url)
        resp = srv.client().post("/api/v1/alerts/channels/hook/test")
        assert resp.status_code == 502
        error = resp.json()["error"]
        assert error["code"] == "alert_undeliverable"
        assert "could not connect" in error["message"]
        (failed,) = srv.client().get("/api/v1/alerts/deliveries").json()["items"]
        assert failed["status"] == "failed"
        assert failed["purpose"] == "test"


def test_a_lost_node_alerts_once_and_recovers_when_heard_again(
    tmp_path: Path, database_url: str
) -> None:
    from dataclasses import replace

    from floom.services.alerts.watch import watch_nodes
    from floom.services.ops import nodes
    from floom.store.models import utcnow
    from floom.store.nodes import Node

    with (
        receiver() as hook,
        live_server(
            tmp_path / "d", database_url, agent_http_allow_private=True, alert_poll_seconds=3600
        ) as srv,
    ):
        _hook_channel(srv, hook.url)
        rule = {"name": "cluster", "events": ["node.lost"], "channels": ["hook"]}
        assert srv.client().post("/api/v1/alerts/rules", json=rule).status_code == 201
        other = replace(srv.ctx, node_id="other-node")  # a second node on the same store
        nodes.register(other, slots=None)
        with session_scope(srv.ctx.engine, write=True) as s:
            row = s.get(Node, "other-node")
            assert row is not None
            # Silent for a minute, by its clock and the database's.
            row.heartbeat_at = row.heard_at = utcnow() - timedelta(seconds=60)
            s.add(row)
        assert watch_nodes(srv.ctx, now=utcnow()) == 1
        assert watch_nodes(srv.ctx, now=utcnow()) == 0  # still lost: once
        nodes.heartbeat(other, slots_in_use=0)
        assert watch_nodes(srv.ctx, now=utcnow()) == 1  # heard again
        assert _sent(srv) == ["node.lost", "recovered"]
        assert hook.bodies()[0]["details"]["node"] == "other-node"


GATED = """\
name: gated
outputs:
  greeting: string
approvals: {required: true}
"""
GATED_RUN = 'import json\njson.dump({"outputs": {"greeting": "hi"}}, open("result.json", "w"))\n'


def test_a_run_waiting_for_approval_too_long_alerts_once(tmp_path: Path, database_url: str) -> None:
    from floom.services.alerts.watch import watch_approvals
    from floom.store.agents import Approval

    with (
        receiver() as hook,
        live_server(
            tmp_path / "d", database_url, agent_http_allow_private=True, alert_poll_seconds=3600
        ) as srv,
    ):
        _hook_channel(srv, hook.url)
        rule = {"name": "waits", "events": ["approval.waiting"], "channels": ["hook"]}
        api = srv.client()
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 201
        deploy_folder(api, make_worker(tmp_path / "g", GATED, {"run.py": GATED_RUN}))
        run = api.post("/api/v1/workers/gated/runs", json={}).json()
        wait_until(
            lambda: api.get(f"/api/v1/runs/{run['id']}").json()["status"] == "awaiting_approval"
        )
        with session_scope(srv.ctx.engine) as s:
            asked = s.exec(select(Approval)).one().created_at
        wait = timedelta(seconds=srv.ctx.settings.alert_approval_wait_seconds)
        assert watch_approvals(srv.ctx, now=asked + wait - timedelta(seconds=1)) == 0
        assert watch_approvals(srv.ctx, now=asked + wait + timedelta(seconds=1)) == 1
        assert watch_approvals(srv.ctx, now=asked + wait * 2) == 0
        assert _sent(srv) == ["approval.waiting"]
        assert hook.bodies()[0]["run_id"] == run["id"]


def test_a_rule_refusal_quotes_a_bounded_part_of_what_was_sent(server: LiveServer) -> None:
    with server.client() as api:
        rules = "/api/v1/alerts/rules"
        many = {"name": "many", "events": ["nope.x"] * 5000, "channels": ["ops"]}
        resp = api.post(rules, json=many)
        assert resp.status_code == 422, resp.text[:300]
        error = resp.json()["error"]
        assert "and 4996 more" in error["message"]  # 5,000 unknown and one "twice"
        assert len(error["message"]) < 2000
        assert len(error["details"]) <= 50
        long_name = {"name": "N" * 100_000, "events": ["run.failed"], "channels": ["ops"]}
        resp = api.post(rules, json=long_name)
        assert resp.status_code == 422, resp.text[:300]
        assert len(resp.text) < 4000


def test_a_webhook_secret_that_is_not_a_standard_webhooks_key_is_refused_when_saved(
    tmp_path: Path, database_url: str
) -> None:
    # The library signs with almost any text (it drops what is not base64 and decodes the
    # rest): "hunter22" was taken when the channel was saved, and a receiver verifying with
    # the key as written refused every alert. The secret's value is never quoted back.
    def b64(size: int) -> str:
        return base64.b64encode(b"w" * size).decode()

    not_keys = {
        "PLAIN": "hunter22",
        "NO_PREFIX": b64(32),
        "NOT_BASE64": "whsec_" + "A" * 31 + "!",
        "TOO_SHORT": "whsec_" + b64(16),
        "TOO_LONG": "whsec_" + b64(65),
        "SPACE_FIRST": " " + KEY,
        "BAD_PADDING": KEY + "=",
    }
    with (
        receiver() as hook,
        live_server(tmp_path / "d", database_url, agent_http_allow_private=True) as srv,
    ):
        api = srv.client()
        channels = "/api/v1/alerts/channels"
        for name, value in not_keys.items():
            secrets.set_secret(srv.ctx, name=name, value=value, caller=SYSTEM)
            config = {"url": hook.url, "secret": name}
            resp = api.post(channels, json={"name": "hook", "kind": "webhook", "config": config})
            error = _refused(resp, "alert_channel_invalid", "config.secret")
            assert f"secret {name} does not hold a Standard Webhooks key" in error["message"]
            assert "whsec_ followed by the base64 of 24 to 64 random bytes" in error["message"]
            assert value.strip() not in resp.text
        assert _count(srv, AlertChannel) == 0

        # As `echo KEY | floom secrets set HOOK_KEY` stores it: the space after is taken.
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY + "\n", caller=SYSTEM)
        config = {"url": hook.url, "secret": "HOOK_KEY"}
        added = api.post(channels, json={"name": "hook", "kind": "webhook", "config": config})
        assert added.status_code == 201, added.text
        replaced = api.put(f"{channels}/hook", json={"config": {**config, "secret": "PLAIN"}})
        _refused(replaced, "alert_channel_invalid", "config.secret")
        changed = api.patch(f"{channels}/hook", json={"config": {"secret": "TOO_SHORT"}})
        _refused(changed, "alert_channel_invalid", "config.secret")
        (kept,) = api.get(channels).json()["items"]
        assert kept["config"]["secret"] == "HOOK_KEY"
        sent = api.post(f"{channels}/hook/test")
        assert sent.status_code == 200, sent.text
        assert Webhook(KEY).verify(hook.accepted[0][1], hook.accepted[0][0])["type"] == "test"

        # A secret set to a non-key after the channel was saved fails at send, saying so.
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value="hunter22", caller=SYSTEM)
        failed = api.post(f"{channels}/hook/test")
        assert failed.status_code == 502, failed.text
        error = failed.json()["error"]
        assert error["code"] == "alert_undeliverable"
        assert (
            "secret HOOK_KEY of channel hook does not hold a Standard Webhooks key"
            in (error["message"])
        )
        assert "hunter22" not in failed.text
        assert len(hook.accepted) == 1
