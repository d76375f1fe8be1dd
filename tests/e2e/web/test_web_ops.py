"""Operator items of the web UI over plain HTTP: signing in from any sign-in page still
shown, error pages linking back to their list, the runs list's free time range, who started
a run by the key's name, and the log stream telling a page the run's status."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import httpx

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.runs import lifecycle as runs
from floom.services.runs import stats as run_stats
from floom.services.triggers import registry as triggers
from floom.store.db import session_scope
from floom.store.models import Run, new_id, utcnow
from floom.ui.support import SESSION_COOKIE
from floom.vocabulary import RunStatus
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
)
from tests.support.web import csrf_of, signed_in_client


def test_signing_in_works_from_every_sign_in_page_the_browser_still_shows(
    server: LiveServer,
) -> None:
    browser = server.client(key="", timeout=10)
    first_tab = csrf_of(browser.get("/login").text)
    second_tab = csrf_of(browser.get("/login", params={"next": "/runs"}).text)
    done = browser.post(
        "/login", data={"csrf": second_tab, "api_key": server.admin_key, "next": "/runs"}
    )
    assert done.status_code == 303
    assert SESSION_COOKIE in browser.cookies
    # The page opened first, posted after the second tab signed in, works too.
    again = browser.post("/login", data={"csrf": first_tab, "api_key": server.admin_key})
    assert again.status_code == 303
    # Another site still cannot post a form: it has no matching cookie.
    stranger = server.client(key="", timeout=10)
    forged = stranger.post("/login", data={"csrf": first_tab, "api_key": server.admin_key})
    assert forged.status_code == 403


def test_a_missing_page_links_back_to_the_list_it_belongs_to(server: LiveServer) -> None:
    client = signed_in_client(server, server.admin_key)
    run = client.get("/runs/run_00000000000000deadbeef")
    assert run.status_code == 404
    assert '<a href="/runs" class="back">' in run.text
    worker = client.get("/workers/no-such-worker")
    assert worker.status_code == 404
    assert '<a href="/" class="back">' in worker.text


def test_the_runs_list_filters_by_a_free_time_range_and_refuses_a_bad_time(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    ids = [
        wait_for_run(api, api.post("/api/v1/workers/hello/runs", json={}).json()["id"])["id"]
        for _ in range(3)
    ]
    with session_scope(server.ctx.engine, write=True) as s:
        for days, run_id in zip((10, 5), ids[:2], strict=True):
            row = s.get(Run, run_id)
            assert row is not None
            row.created_at = utcnow() - timedelta(days=days)
            s.add(row)
    client = signed_in_client(server, server.admin_key)
    since = (utcnow() - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M")
    until = (utcnow() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    page = client.get("/runs", params={"after": since, "before": until})
    shown = list(dict.fromkeys(re.findall(r'<a href="/runs/(run_[0-9a-f]+)"', page.text)))
    assert shown == [ids[1]]
    assert f'value="{since}"' in page.text
    bad = client.get("/runs", params={"after": "last tuesday"})
    assert bad.status_code == 400
    assert "2026-12-03T14:05" in bad.text


def test_a_run_page_names_the_key_that_started_the_run(server: LiveServer) -> None:
    key_row, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="nightly-ci")
    with server.client() as admin:
        deploy_folder(admin, EXAMPLES / "hello")
    with server.client(token) as ci:
        run = ci.post("/api/v1/workers/hello/runs", json={}).json()
    page = signed_in_client(server, server.admin_key).get(f"/runs/{run['id']}")
    assert "by nightly-ci" in page.text
    assert f'title="API key {key_row.id}"' in page.text


def test_the_log_stream_tells_the_page_when_a_queued_run_starts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'floom.db'}"
    # No executor: the run stays queued until the test moves it, as a claim would.
    with live_server(tmp_path, url, roles="api") as node, node.client() as api:
        deploy_folder(api, EXAMPLES / "hello")
        run_id = api.post("/api/v1/workers/hello/runs", json={}).json()["id"]
        seen: list[str] = []
        page = signed_in_client(node, node.admin_key)
        with page.stream("GET", f"/runs/{run_id}/logs/stream") as stream:
            kind = ""
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: ") and kind == "status":
                    seen.append(json.loads(line.removeprefix("data: "))["status"])
                    if seen == ["queued"]:
                        with session_scope(node.ctx.engine, write=True) as s:
                            row = s.get(Run, run_id)
                            assert row is not None
                            row.status, row.started_at = RunStatus.RUNNING, utcnow()
                            s.add(row)
                    if len(seen) == 2:
                        break
        assert seen == ["queued", "running"]
        assert runs.get_run(node.ctx, caller=SYSTEM, run_id=run_id).status == "running"


def test_pause_and_resume_buttons_pause_a_worker_and_one_trigger_for_deploy_keys_only(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "ticker",
        'name: ticker\ntriggers:\n  - schedule: {cron: "0 3 * * *"}\n',
        {"run.py": "print('tick')\n"},
    )
    deploy_folder(api, folder)
    client = signed_in_client(server, server.admin_key)
    page = client.get("/workers/ticker")
    assert 'action="/workers/ticker/pause"' in page.text
    (trigger,) = triggers.list_triggers(server.ctx, caller=SYSTEM, worker_name="ticker")[1]

    done = client.post(
        "/workers/ticker/pause", data={"csrf": csrf_of(page.text), "trigger_id": trigger.id}
    )
    assert done.status_code == 303
    assert "notice=paused" in done.headers["location"]
    worker, (paused_trigger,) = triggers.list_triggers(
        server.ctx, caller=SYSTEM, worker_name="ticker"
    )
    assert paused_trigger.paused
    assert not worker.paused
    client.post("/workers/ticker/pause", data={"csrf": csrf_of(page.text)})
    assert triggers.list_triggers(server.ctx, caller=SYSTEM, worker_name="ticker")[0].paused
    after = client.get("/workers/ticker", params={"notice": "paused"})
    assert 'action="/workers/ticker/resume"' in after.text
    assert "Paused:" in after.text
    client.post("/workers/ticker/resume", data={"csrf": csrf_of(after.text)})
    assert not triggers.list_triggers(server.ctx, caller=SYSTEM, worker_name="ticker")[0].paused

    _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="looker")
    looker = signed_in_client(server, reader)
    seen = looker.get("/workers/ticker")
    assert 'action="/workers/ticker/pause"' not in seen.text
    refused = looker.post("/workers/ticker/pause", data={"csrf": csrf_of(seen.text)})
    assert refused.status_code == 403
    assert not triggers.list_triggers(server.ctx, caller=SYSTEM, worker_name="ticker")[0].paused


def test_a_worker_page_charts_its_last_30_days_by_outcome_with_duration_percentiles(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    now = utcnow()
    spans = {
        RunStatus.SUCCEEDED: [1.0, 2.0, 3.0, 10.0],
        RunStatus.FAILED: [4.0],
        RunStatus.CANCELLED: [0.5],
    }
    with session_scope(server.ctx.engine, write=True) as s:
        for status, seconds in spans.items():
            for took in seconds:
                s.add(
                    Run(
                        id=new_id("run"),
                        worker_name="hello",
                        version_id="v",
                        status=status,
                        created_at=now - timedelta(days=2),
                        started_at=now - timedelta(days=2),
                        finished_at=now - timedelta(days=2) + timedelta(seconds=took),
                    )
                )
        s.add(
            Run(
                id=new_id("run"),
                worker_name="hello",
                version_id="v",
                status=RunStatus.SUCCEEDED,
                created_at=now - timedelta(days=40),
            )
        )
    history = run_stats.daily_history(server.ctx, caller=SYSTEM, worker_name="hello", now=now)
    assert len(history) == 30
    assert sum(d.total for d in history) == 6
    busy = history[-3]
    assert busy.counts == {"succeeded": 4, "failed": 1, "other": 1}
    assert (busy.p50, busy.p95) == (2.0, 10.0)

    page = signed_in_client(server, server.admin_key).get("/workers/hello")
    assert '<svg class="chart"' in page.text
    assert 'class="chart-failed"' in page.text
    assert "4 succeeded, 1 failed, 1 other; p50 2.0 s, p95 10.0 s" in page.text
