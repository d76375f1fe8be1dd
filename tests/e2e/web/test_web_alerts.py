"""The Alerts page in a real headless Chromium: add a channel (a bad one is refused naming the
setting, nothing added), send it a test alert that a loopback receiver gets, add a rule, and
see the deliveries with their status."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.alerts import rules
from tests.support import web as web_support
from tests.support.harness import live_server
from tests.support.rigs.alerts import receiver
from tests.support.web import Tab

pytest.importorskip("playwright.sync_api")

browser = web_support.browser
KEY = "whsec_" + base64.b64encode(b"u" * 32).decode()


def test_a_channel_is_added_tested_and_its_deliveries_listed_from_the_alerts_page(
    browser: Any, tmp_path: Path
) -> None:
    with (
        receiver() as hook,
        live_server(
            tmp_path, f"sqlite:///{tmp_path / 'floom.db'}", agent_http_allow_private=True
        ) as srv,
    ):
        secrets.set_secret(srv.ctx, name="HOOK_KEY", value=KEY, caller=SYSTEM)
        tab = Tab(browser, srv)
        try:
            tab.sign_in()
            tab.page.get_by_role("link", name="Alerts").click()
            page = tab.page
            page.get_by_label("Name", exact=True).fill("ops")
            page.get_by_label("Webhook URL").fill(hook.url)
            page.get_by_label("Webhook signing key: secret name").fill("MISSING_KEY")
            page.get_by_role("button", name="Add channel").click()
            assert (
                "config.secret: no secret named MISSING_KEY"
                in page.locator(".problem").inner_text()
            )
            assert page.get_by_label("Webhook URL").input_value() == hook.url  # kept to fix
            page.get_by_label("Webhook signing key: secret name").fill("HOOK_KEY")
            page.get_by_role("button", name="Add channel").click()
            page.wait_for_selector("text=Channel added")
            page.get_by_role("button", name="Send a test alert to ops").click()
            page.wait_for_selector("text=Test alert delivered to ops")
            assert hook.bodies()[0]["type"] == "test"
            assert "delivered" in page.locator("table").last.inner_text()
            page.get_by_label("Rule name").fill("failures")
            page.get_by_label(
                "Events (comma-separated: run.failed, schedule.*, node.lost, *)"
            ).fill("run.failed, schedule.*")
            page.get_by_label("Channels (comma-separated)").fill("ops")
            page.get_by_role("button", name="Add rule").click()
            page.wait_for_selector("text=Rule added")
            assert "schedule.*" in page.locator("#rules-title + p + table").inner_text()
            page.get_by_role("button", name="Disable failures").click()
            page.wait_for_selector("text=Rule disabled")
            assert [r.enabled for r in rules.list_rules(srv.ctx, caller=SYSTEM)] == [False]
            page.get_by_role("button", name="Enable failures").click()
            page.wait_for_selector("text=Rule enabled")
            assert [r.enabled for r in rules.list_rules(srv.ctx, caller=SYSTEM)] == [True]
            assert tab.problems == []
        finally:
            tab.close()
