"""The run page in a real headless Chromium: a page opened while the run is queued shows it
running as soon as it starts, without a reload (the live log stream tells the status)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from floom.store.db import session_scope
from floom.store.models import Run, utcnow
from floom.vocabulary import RunStatus
from tests.support import web as web_support
from tests.support.harness import EXAMPLES, deploy_folder, live_server
from tests.support.web import Tab

pytest.importorskip("playwright.sync_api")

browser = web_support.browser


@pytest.fixture
def api_only(tmp_path: Path) -> Iterator[Any]:
    # No executor: the run stays queued until the test moves it, as a claim would.
    with live_server(tmp_path, f"sqlite:///{tmp_path / 'floom.db'}", roles="api") as node:
        yield node


def test_a_run_page_opened_while_queued_shows_running_once_the_run_starts(
    browser: Any, api_only: Any
) -> None:
    with api_only.client() as api:
        deploy_folder(api, EXAMPLES / "hello")
        run_id = api.post("/api/v1/workers/hello/runs", json={}).json()["id"]
    tab = Tab(browser, api_only)
    try:
        tab.sign_in()
        tab.goto(f"/runs/{run_id}")
        badge = tab.page.locator("#run-status .badge")
        assert "queued" in badge.inner_text()
        tab.page.wait_for_function(
            "document.getElementById('log-status').textContent.startsWith('Live')"
        )
        with session_scope(api_only.ctx.engine, write=True) as s:
            row = s.get(Run, run_id)
            assert row is not None
            row.status, row.started_at = RunStatus.RUNNING, utcnow()
            s.add(row)
        tab.page.wait_for_selector("#run-status .badge-running")
        assert tab.problems == []
    finally:
        tab.close()
