"""Deleting a worker from its page in a real headless Chromium (SQLite only: the REST and
plain-HTTP tests in test_worker_deletion.py cover both databases)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.support import web as web_support
from tests.support.harness import deploy_folder, make_worker, wait_for_run
from tests.support.web import Tab

pytest.importorskip("playwright.sync_api")

database_url = web_support.sqlite_database_url
browser = web_support.browser
tab = web_support.tab


def test_a_worker_is_deleted_from_its_page_after_confirming_and_its_runs_stay_readable(
    tab: Tab, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "gone", "name: gone\n", {"run.py": "print(1)\n"}))
    run_id = api.post("/api/v1/workers/gone/runs", json={}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"
    tab.sign_in()
    tab.goto("/workers/gone")
    delete = tab.page.get_by_role("button", name="Delete gone")
    # The typed name is required: the browser refuses the empty form and nothing is posted.
    delete.click()
    assert tab.page.url == tab.url("/workers/gone")
    tab.page.get_by_label("Type gone to confirm").fill("gone")
    delete.click()  # the confirmation dialog is accepted by the tab
    tab.page.wait_for_url(re.compile(r".*/\?notice=deleted$"))
    assert "Deleted" in tab.page.get_by_role("status").inner_text()
    assert tab.page.get_by_role("link", name="gone", exact=True).count() == 0
    assert api.get("/api/v1/workers/gone").status_code == 404

    tab.goto(f"/runs/{run_id}")
    assert "(deleted)" in tab.page.inner_text("#run-summary")
    tab.shot("worker-deleted-run")
