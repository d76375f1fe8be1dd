"""`floom alerts ...` and `floom run --callback-url`, run as a subprocess against a live server
with loopback receivers."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from standardwebhooks.webhooks import Webhook

from tests.support.harness import LiveServer, deploy_folder, live_server, make_worker
from tests.support.rigs.alerts import receiver

KEY = "whsec_" + base64.b64encode(b"c" * 32).decode()


def floom(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=server.cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_channels_rules_tests_deliveries_and_callbacks_from_the_command_line(
    tmp_path: Path, database_url: str
) -> None:
    with (
        receiver() as hook,
        live_server(
            tmp_path / "d",
            database_url,
            agent_http_allow_private=True,
            alert_poll_seconds=0.1,
            alert_retry_seconds=0.1,
        ) as srv,
    ):
        api = srv.client()
        api.put("/api/v1/secrets/HOOK_KEY", json={"value": KEY})
        added = floom(
            srv,
            "alerts",
            "channels",
            "add",
            "ops",
            "--kind",
            "webhook",
            "--url",
            hook.url,
            "--secret",
            "HOOK_KEY",
        )
        assert added.returncode == 0, added.stderr
        listing = floom(srv, "alerts", "channels")
        assert "ops" in listing.stdout
        assert "secret=HOOK_KEY" in listing.stdout
        assert KEY not in listing.stdout

        bad = floom(srv, "alerts", "rules", "add", "r", "--event", "run.fialed", "--channel", "ops")
        assert bad.returncode == 1
        assert "run.failed" in bad.stderr
        rule = floom(srv, "alerts", "rules", "add", "r", "--event", "run.*", "--channel", "ops")
        assert rule.returncode == 0, rule.stderr
        assert "run.*" in floom(srv, "alerts", "rules").stdout
        disabled = floom(srv, "alerts", "rules", "disable", "r", "--json")
        assert disabled.returncode == 0, disabled.stderr
        assert json.loads(disabled.stdout)["enabled"] is False
        assert api.get("/api/v1/alerts/rules").json()["items"][0]["enabled"] is False
        assert floom(srv, "alerts", "rules", "enable", "r").returncode == 0
        assert api.get("/api/v1/alerts/rules").json()["items"][0]["enabled"] is True
        missing = floom(srv, "alerts", "rules", "enable", "nope")
        assert missing.returncode == 1
        assert "no alert rule named nope" in missing.stderr

        refused_update = floom(srv, "alerts", "channels", "update", "ops", "--secret", "NOT_SET")
        assert refused_update.returncode == 1
        assert "config.secret" in refused_update.stderr
        assert api.get("/api/v1/alerts/channels").json()["items"][0]["config"]["secret"] == (
            "HOOK_KEY"
        )
        updated = floom(srv, "alerts", "channels", "update", "ops", "--url", hook.url + "?v=2")
        assert updated.returncode == 0, updated.stderr
        config = api.get("/api/v1/alerts/channels").json()["items"][0]["config"]
        assert config == {"url": hook.url + "?v=2", "secret": "HOOK_KEY"}  # the rest kept
        floom(srv, "alerts", "channels", "update", "ops", "--url", hook.url)

        sent = floom(srv, "alerts", "test", "ops")
        assert sent.returncode == 0, sent.stderr
        assert "delivered" in sent.stdout
        assert Webhook(KEY).verify(hook.accepted[0][1], hook.accepted[0][0])["type"] == "test"

        deploy_folder(api, make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"}))
        refused = floom(srv, "run", "w", "--callback-url", "ftp://example.com/x")
        assert refused.returncode == 1
        assert "callback_url" in refused.stderr
        ran = floom(srv, "run", "w", "--wait", "--json", "--callback-url", hook.url)
        assert ran.returncode == 0, ran.stderr
        run_id = json.loads(ran.stdout)["id"]
        hook.wait_for(2)
        key = floom(srv, "alerts", "callback-key").stdout.strip()
        body = Webhook(key).verify(hook.accepted[1][1], hook.accepted[1][0])
        assert body["run"]["id"] == run_id

        shown = json.loads(floom(srv, "alerts", "deliveries", "--json").stdout)
        assert {d["purpose"] for d in shown["items"]} == {"test", "callback"}
        assert "delivered" in floom(srv, "alerts", "deliveries").stdout


def test_channels_update_unset_removes_an_optional_setting_and_refuses_what_it_cannot(
    tmp_path: Path, database_url: str
) -> None:
    # PATCH removes a setting sent as null; `--unset SETTING` is how the CLI sends one. What
    # the channel's kind does not have, or needs, is refused naming it, and nothing changes.
    resolve = "mail.example.com=93.184.215.14"
    with live_server(tmp_path / "d", database_url, agent_http_resolve=resolve) as srv:
        api = srv.client()
        api.put("/api/v1/secrets/SMTP_PASSWORD", json={"value": "mail-pass-1"})
        mail = {
            "host": "mail.example.com",
            "port": 25,
            "starttls": False,
            "username": "floom",
            "password_secret": "SMTP_PASSWORD",
            "sender": "floom@example.com",
            "to": ["ops@example.com"],
        }
        added = api.post(
            "/api/v1/alerts/channels", json={"name": "mail", "kind": "email", "config": mail}
        )
        assert added.status_code == 201, added.text

        def config() -> dict[str, object]:
            (channel,) = api.get("/api/v1/alerts/channels").json()["items"]
            settings: dict[str, object] = channel["config"]
            return settings

        for args, exit_code, words in (
            # A password without its login is refused by the server.
            (["--unset", "username"], 1, "config.username: missing"),
            (["--unset", "pasword_secret"], 1, "config.pasword_secret"),
            (["--unset", "url"], 1, "config.url: unknown setting for a email channel"),
            (["--unset", "host"], 1, "config.host: required"),
            (["--unset", "from"], 1, "config.sender: required"),
            (["--unset", "Bad Key!"], 2, "is not a setting name"),
            (["--username", "x", "--unset", "username"], 2, "both given a value and unset"),
        ):
            refused = floom(srv, "alerts", "channels", "update", "mail", *args)
            assert refused.returncode == exit_code, (args, refused.stdout, refused.stderr)
            assert words in " ".join(refused.stderr.split()), (args, refused.stderr)
            assert config() == mail, args

        removed = floom(
            srv,
            "alerts",
            "channels",
            "update",
            "mail",
            "--unset",
            "username",
            "--unset",
            "password-secret",
            "--port",
            "587",
        )
        assert removed.returncode == 0, removed.stderr
        assert "port; removed password_secret, username" in removed.stdout
        left = {k: v for k, v in mail.items() if k not in ("username", "password_secret")}
        assert config() == {**left, "port": 587}
        shown = floom(srv, "alerts", "channels")
        assert "password_secret" not in shown.stdout
