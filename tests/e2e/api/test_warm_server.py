"""Warm starts through the server: a worker with `warm: true` starts its runs from a warm
process once its pool is ready, and /healthz and /metrics show the pool, its hits and misses
(the pools, which name workers, to a caller with a read key only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from floom.bundle import read_folder
from floom.sandbox.local.warm.pools import warm_prefix
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.support.cli import cli
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="warm starts need a root floom")

WORKER = """\
import json, os
from pathlib import Path
Path("result.json").write_text(json.dumps({"outputs": {"pid": os.getpid()}}))
"""


def test_a_warm_workers_runs_start_warm_and_health_and_metrics_show_its_pool(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "quick",
        "name: quick\nwarm: true\noutputs: {pid: {type: integer}}\n",
        {"run.py": WORKER},
    )
    deploy_folder(api, folder)
    pids: list[int] = []
    deadline = time.monotonic() + 60
    while 1 not in pids:
        assert time.monotonic() < deadline, pids
        run = wait_for_run(api, api.post("/api/v1/workers/quick/runs", json={}).json()["id"])
        assert run["status"] == "succeeded", run
        pids.append(run["outputs"]["pid"])
    assert pids[0] != 1  # the version's first run starts cold and records what it loads

    warm = api.get("/healthz").json()["warm"]
    assert warm["enabled"] is True
    assert warm["hits"] >= 1
    assert warm["misses"] >= 1
    (pool,) = [p for p in warm["pools"] if p["worker"] == "quick"]
    assert pool["hits"] >= 1
    assert pool["modules"] > 0
    assert pool["rss_bytes"] > 0
    # A pool names a worker and its version: not told to a caller without a read key.
    for token in ("", "flm_not-a-key"):
        with server.client(token) as anonymous:
            told = anonymous.get("/healthz").json()["warm"]
        assert told["pools"] == []
        assert told["hits"] == warm["hits"]

    _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="prometheus")
    with server.client(reader) as scraper:
        text = scraper.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("floom_warm_hits_total", ())] >= 1
    assert samples[("floom_warm_misses_total", ())] >= 1
    assert samples[("floom_warm_pools", ())] >= 1
    version = pool["version"]
    labels = (("version", version), ("worker", "quick"))
    assert samples[("floom_warm_resident_bytes", labels)] > 0

    listed = cli(server, "nodes")
    assert listed.returncode == 0, listed.stderr
    assert "warm starts on" in listed.stdout
    assert "quick" in listed.stdout
    as_json = json.loads(cli(server, "nodes", "--json").stdout)
    (me,) = [n for n in as_json if n["id"] == server.ctx.node_id]
    assert any(p["worker"] == "quick" for p in me["warm"]["pools"])


def test_a_worker_yml_asking_warm_starts_for_a_shell_entry_is_refused_with_a_hint(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "shell", "name: shell\nwarm: true\n", {"run.sh": "echo hi\n"})
    archive = read_folder(folder, max_bytes=1024 * 1024).to_archive()
    resp = api.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    assert resp.status_code == 400, resp.text
    assert "warm: true needs a Python entry" in resp.text


def _warm_processes(work_root: Path) -> list[int]:
    prefix = warm_prefix(work_root).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(word.startswith(prefix) for word in argv):
                found.append(int(entry))
    return found


def test_a_node_that_stops_ends_its_warm_processes(tmp_path: Path, database_url: str) -> None:
    with live_server(tmp_path / "data", database_url) as node:
        with node.client(node.admin_key) as api:
            folder = make_worker(
                tmp_path / "quick",
                "name: quick\nwarm: true\noutputs: {pid: {type: integer}}\n",
                {"run.py": WORKER},
            )
            deploy_folder(api, folder)
            deadline = time.monotonic() + 60
            while not _warm_processes(node.ctx.settings.work_root):
                assert time.monotonic() < deadline, "no warm process started"
                run_id = api.post("/api/v1/workers/quick/runs", json={}).json()["id"]
                assert wait_for_run(api, run_id)["status"] == "succeeded"
        work_root = node.ctx.settings.work_root
    deadline = time.monotonic() + 10
    while _warm_processes(work_root):
        assert time.monotonic() < deadline, "a warm process outlived its node"
        time.sleep(0.05)
