"""Starting a run and waiting for its end in the same request (`POST /workers/{name}/runs?wait=`):
one round trip for a caller that wants the result, under the same per-key cap of waits as
`GET /runs/{id}?wait=`, and never a refusal that would hide the run it created."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from floom.client.rest import FloomClient
from floom.schemas.runs import RunDetail, RunRequest
from floom.services.runs import waits as run_waits
from floom.store.db import read_connection
from tests.e2e.api.test_waits import NOOP, CountingTransport, deploy, keys_of, make_server, start
from tests.support.harness import LiveServer, wait_until

__all__ = ["make_server"]  # the fixture, shared with test_waits


def test_a_start_with_wait_answers_200_with_the_ended_run_in_one_request(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server()
    with server.client() as api:
        deploy(api, tmp_path, "quick", NOOP)
    transport = CountingTransport()
    with FloomClient(server.base_url, server.admin_key, transport=transport) as client:
        run = client.start_run("quick", RunRequest(), wait=30)
    assert run.status == "succeeded"
    assert run.outputs == {}
    assert isinstance(run, RunDetail)  # the whole record, as GET /runs/{id} gives it
    (request,) = transport.requests
    assert (request.method, request.url.path) == ("POST", "/api/v1/workers/quick/runs")


def test_a_start_with_wait_answers_with_the_record_its_end_wrote_without_reading_it_back(
    make_server: Callable[..., LiveServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server()
    script = (
        "import json, os\n"
        "for name in ('note.txt', 'a.txt'):\n"
        "    open(os.path.join(os.environ['FLOOM_OUTPUT_DIR'], name), 'w').write(name)\n"
        "json.dump({'outputs': {'n': 1}}, open('result.json', 'w'))\n"
    )
    reads: list[str] = []
    real_read = read_connection

    def counting_read(engine: Any) -> Any:
        reads.append(threading.current_thread().name)
        return real_read(engine)

    with server.client() as api:
        deploy(api, tmp_path, "noted", script)
        monkeypatch.setattr(run_waits, "read_connection", counting_read)
        resp = api.post("/api/v1/workers/noted/runs", params={"wait": 30}, json={})
        monkeypatch.undo()
        assert resp.status_code == 200, resp.text
        stored = api.get(f"/api/v1/runs/{resp.json()['id']}").json()
    answer = resp.json()
    assert answer["status"] == "succeeded"
    assert answer["outputs"] == {"n": 1}
    assert [a["name"] for a in answer["artifacts"]] == ["a.txt", "note.txt"]
    assert answer == stored  # the record as stored, to the field
    assert reads == []


def test_a_start_whose_run_outlasts_the_wait_answers_202_with_the_run_as_it_is(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    # API role only: no executor, so the run stays queued.
    server = make_server(roles="api")
    with server.client() as api:
        deploy(api, tmp_path, "idle", NOOP)
        began = time.monotonic()
        resp = api.post("/api/v1/workers/idle/runs", params={"wait": 0.5}, json={})
        took = time.monotonic() - began
        assert resp.status_code == 202
        assert resp.json()["status"] == "queued"
        assert api.get(f"/api/v1/runs/{resp.json()['id']}").status_code == 200
    assert 0.4 < took < 10
    assert server.ctx.node.run_ends.open_waits(keys_of(server)) == 0


def test_a_start_over_the_wait_cap_is_answered_202_at_once_with_its_run_queued(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api", max_waits_per_key=1)
    with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
        deploy(api, tmp_path, "idle", NOOP)
        held = start(api, "idle")
        pool.submit(api.get, f"/api/v1/runs/{held}", params={"wait": 20}, timeout=40)
        wait_until(lambda: server.ctx.node.run_ends.open_waits(keys_of(server)) == 1, timeout=10)

        began = time.monotonic()
        resp = api.post("/api/v1/workers/idle/runs", params={"wait": 20}, json={})
        took = time.monotonic() - began
        assert resp.status_code == 202, resp.text
        assert resp.json()["status"] == "queued"
        assert api.get(f"/api/v1/runs/{resp.json()['id']}").json()["status"] == "queued"
        api.post(f"/api/v1/runs/{held}/cancel")
    assert took < 5, f"the start over the cap answered after {took:.1f}s"
