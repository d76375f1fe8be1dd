"""The worker page's boxes as rendered: the manifest as written, the duration chart, the
state of its triggers; and the nodes page's host names."""

from __future__ import annotations

import html
import re
from datetime import date
from pathlib import Path

import anyio
import httpx
import pytest

from floom.services.runs.stats import Day
from floom.ui.chart import history_chart
from tests.support.cli import cli
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, make_worker
from tests.support.mcp_clients import call_raw, http_client, text_of
from tests.support.web import signed_in_client

MANIFEST = """\
name: clocked
# a comment only the file as written has
description: Runs every morning.
triggers:
  - schedule: {cron: "0 9 * * *", timezone: Europe/Paris}
"""
SCRIPT = 'import json\njson.dump({"outputs": {}}, open("result.json", "w"))\n'


def _section(page: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}".*?</section>', page, re.S)
    assert match, f"no #{section_id} on the page"
    return match.group(0)


def test_the_manifest_box_shows_worker_yml_as_it_was_deployed(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "clocked", MANIFEST, {"run.py": SCRIPT}))
    page = signed_in_client(server, server.admin_key).get("/workers/clocked")
    assert page.status_code == 200
    box = html.unescape(_section(page.text, "manifest"))
    assert "# a comment only the file as written has" in box
    assert 'cron: "0 9 * * *"' in box


def test_a_single_day_of_runs_draws_a_visible_duration_line() -> None:
    day = Day(day=date(2026, 1, 5), p50=1.5, p95=3.0)
    day.counts["succeeded"] = 2
    chart = history_chart([day])
    for line in (chart["p50"], chart["p95"]):
        points = [tuple(map(float, p.split(","))) for p in line.split()]
        # A polyline through one point draws nothing; two distinct points draw a stroke.
        assert len(points) >= 2, line
        assert points[0][0] != points[-1][0], line


def test_a_paused_workers_triggers_show_paused_with_no_next_fire_on_every_surface(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "clocked", MANIFEST, {"run.py": SCRIPT}))
    assert api.get("/api/v1/workers/clocked/triggers").json()["items"][0]["next_fires"]
    assert api.post("/api/v1/workers/clocked/pause", json={}).status_code == 200

    listed = api.get("/api/v1/workers/clocked/triggers").json()["items"][0]
    assert (listed["active"], listed["next_fires"]) == (False, [])
    summary = api.get("/api/v1/workers/clocked").json()["triggers"][0]
    assert summary["active"] is False
    assert summary.get("next_fire") is None

    listing = cli(server, "triggers", "clocked")
    assert listing.returncode == 0, listing.stderr
    assert "active" not in listing.stdout
    assert "next fires" not in listing.stdout
    assert "paused with its worker" in listing.stdout

    client = signed_in_client(server, server.admin_key)
    triggers = _section(client.get("/workers/clocked").text, "triggers")
    assert "paused with its worker" in triggers
    assert "next</span>" not in triggers
    workers_page = client.get("/").text
    assert "paused with its worker" in workers_page
    assert "next</span>" not in workers_page

    assert api.post("/api/v1/workers/clocked/resume", json={}).status_code == 200
    triggers = _section(client.get("/workers/clocked").text, "triggers")
    assert "paused with its worker" not in triggers
    assert "next</span>" in triggers


def test_the_nodes_page_shows_a_host_name_as_a_fact_not_as_a_hint(server: LiveServer) -> None:
    page = signed_in_client(server, server.admin_key).get("/nodes").text
    host = re.search(r"<td data-label=\"Node\"[^>]*>.*?</td>", page, re.S)
    assert host, "no node listed"
    cell = host.group(0)
    assert ">on " in cell
    assert 'class="hint"' not in cell


def test_an_agent_worker_without_a_model_key_is_warned_of_before_it_runs(
    server: LiveServer, api: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert not server.ctx.settings.model_key
    deploy_folder(api, EXAMPLES / "repo-triage")
    deploy_folder(api, EXAMPLES / "hello")

    body = api.get("/api/v1/workers/repo-triage").json()
    assert body["model_key_missing"] is True
    assert "model_key_missing" not in api.get("/api/v1/workers/hello").json()  # a script

    page = signed_in_client(server, server.admin_key).get("/workers/repo-triage").text
    assert 'id="model-key-missing"' in page
    assert "FLOOM_ANTHROPIC_API_KEY" in page

    async def over_mcp() -> str:
        async with http_client(server) as mcp:
            return text_of(await call_raw(mcp, "get_worker", worker="repo-triage"))

    told = anyio.run(over_mcp)
    assert "no model provider key is set on the floom server" in told

    monkeypatch.setattr(server.ctx.settings, "anthropic_api_key", "sk-ant-set")
    assert "model_key_missing" not in api.get("/api/v1/workers/repo-triage").json()
