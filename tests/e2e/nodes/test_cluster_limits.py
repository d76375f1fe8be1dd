"""A worker's `concurrency` limit holds across executor nodes on one PostgreSQL."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from floom.services.runs.statuses import FINISHED
from tests.support.harness import deploy_folder, live_server, make_worker, wait_until
from tests.support.processes.cluster import node_processes

MANIFEST = """\
name: one-at-a-time
concurrency: 1
outputs:
  start: {type: number}
  end: {type: number}
limits:
  timeout_seconds: 30
"""

SCRIPT = """\
import json, time
start = time.time()
time.sleep(0.03)
end = time.time()
open("result.json", "w").write(json.dumps({"outputs": {"start": start, "end": end}}))
"""

RUNS = 30


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_concurrency_one_never_overlaps_across_three_executor_nodes(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "api", database_url, roles="api") as api_node,
        node_processes(
            tmp_path, database_url, 3, roles="executor", executor_slots="4", lease_seconds="30"
        ),
        api_node.client() as api,
    ):
        deploy_folder(api, make_worker(tmp_path / "w", MANIFEST, {"run.py": SCRIPT}))
        ids = [
            api.post("/api/v1/workers/one-at-a-time/runs", json={"inputs": {}}).json()["id"]
            for _ in range(RUNS)
        ]

        def all_done() -> list[dict[str, object]] | None:
            body = api.get("/api/v1/runs", params={"worker": "one-at-a-time", "limit": 100})
            rows = body.json()["items"]
            done = [r for r in rows if r["status"] in FINISHED]
            return rows if len(done) == RUNS else None

        wait_until(all_done, timeout=90, interval=0.2)
        runs = [api.get(f"/api/v1/runs/{run_id}").json() for run_id in ids]
        starts = [
            line["line"]
            for run_id in ids
            for line in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
            if line["line"].startswith("started attempt")
        ]
    assert {r["status"] for r in runs} == {"succeeded"}
    spans = sorted((r["outputs"]["start"], r["outputs"]["end"], r["id"]) for r in runs)
    overlaps = [(a[2], b[2]) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert overlaps == []
    nodes = {message.rsplit(" on ", 1)[1] for message in starts}
    assert len(nodes) >= 2, f"the nodes did not race: only {nodes} ran runs"
