"""The alert tools and run_worker's callback_url over both MCP backends (the /mcp endpoint in
the server, `floom mcp` over stdio through REST), through the SDK's own client."""

from __future__ import annotations

import base64
from pathlib import Path

import anyio
import pytest
from standardwebhooks.webhooks import Webhook

from tests.support.harness import live_server, make_worker
from tests.support.mcp_clients import call, call_error, http_client, stdio_client, worker_files
from tests.support.rigs.alerts import receiver

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
KEY = "whsec_" + base64.b64encode(b"m" * 32).decode()


@pytest.mark.parametrize("backend", ["endpoint", "stdio"])
def test_channels_rules_test_sends_deliveries_and_callbacks_over_mcp(
    backend: str, tmp_path: Path, database_url: str
) -> None:
    folder = make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"})
    with (
        receiver() as hook,
        live_server(
            tmp_path / "d",
            database_url,
            agent_http_allow_private=True,
            alert_poll_seconds=0.1,
        ) as srv,
    ):
        opener = http_client if backend == "endpoint" else stdio_client

        async def session() -> None:
            async with opener(srv) as mcp:
                await call(mcp, "set_secret", name="HOOK_KEY", value=KEY)
                error = await call_error(
                    mcp,
                    "add_alert_channel",
                    name="ops",
                    kind="webhook",
                    config={"url": "ftp://x", "secret": "HOOK_KEY"},
                )
                assert error["code"] == "alert_channel_invalid"
                assert "config.url" in error["message"]
                await call(
                    mcp,
                    "add_alert_channel",
                    name="ops",
                    kind="webhook",
                    config={"url": hook.url, "secret": "HOOK_KEY"},
                )
                listed = await call(mcp, "list_alert_channels")
                assert listed["items"][0]["config"]["secret"] == "HOOK_KEY"
                sent = await call(mcp, "test_alert_channel", name="ops")
                assert sent["status"] == "delivered"
                error = await call_error(
                    mcp, "add_alert_rule", name="r", events=["nope"], channels=["ops"]
                )
                assert error["code"] == "alert_rule_invalid"
                await call(mcp, "add_alert_rule", name="r", events=["run.*"], channels=["ops"])
                assert (await call(mcp, "list_alert_rules"))["items"][0]["name"] == "r"
                off = await call(mcp, "set_alert_rule_enabled", name="r", enabled=False)
                assert off["enabled"] is False
                assert (await call(mcp, "list_alert_rules"))["items"][0]["enabled"] is False
                on = await call(mcp, "set_alert_rule_enabled", name="r", enabled=True)
                assert on["enabled"] is True
                error = await call_error(mcp, "set_alert_rule_enabled", name="no", enabled=True)
                assert error["code"] == "not_found"

                error = await call_error(
                    mcp,
                    "update_alert_channel",
                    name="ops",
                    config={"url": hook.url, "secret": "NOT_SET"},
                )
                assert error["code"] == "alert_channel_invalid"
                assert "config.secret" in error["message"]
                moved = await call(
                    mcp, "update_alert_channel", name="ops", config={"url": hook.url + "?v=2"}
                )
                # A partial update, as the CLI's and PATCH's: the secret stays.
                assert moved["config"] == {"url": hook.url + "?v=2", "secret": "HOOK_KEY"}

                await call(mcp, "deploy_worker", files=worker_files(folder))
                error = await call_error(
                    mcp, "run_worker", worker="w", callback_url="file:///etc/passwd"
                )
                assert error["code"] == "input_invalid"
                assert "callback_url" in error["message"]
                run = await call(
                    mcp, "run_worker", worker="w", wait_seconds=30, callback_url=hook.url
                )
                with anyio.fail_after(20):
                    while len(hook.accepted) < 2:
                        await anyio.sleep(0.05)
                page = await call(mcp, "list_alert_deliveries", purpose="callback")
                assert page["items"][0]["run_id"] == run["run"]["id"]
                # By channel, a page at a time: the test send, then no more.
                first = await call(mcp, "list_alert_deliveries", channel="ops", limit=1)
                assert [d["id"] for d in first["items"]] == [sent["id"]]
                if first["next_cursor"]:
                    rest = await call(
                        mcp, "list_alert_deliveries", channel="ops", cursor=first["next_cursor"]
                    )
                    assert sent["id"] not in [d["id"] for d in rest["items"]]
                none = await call(mcp, "list_alert_deliveries", channel="nosuch")
                assert none["items"] == []
                resent = await call(mcp, "resend_alert_delivery", delivery_id=sent["id"])
                assert resent["status"] == "pending"

        anyio.run(session)
        assert Webhook(KEY).verify(hook.accepted[0][1], hook.accepted[0][0])["type"] == "test"
