"""What a node does with its running runs when it is told to stop: it drains them for
FLOOM_DRAIN_SECONDS, interrupts the rest (at once on a second signal), and the next attempt
of an interrupted run knows how the one before it ended."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.processes.server_process import ServerProcess

SLOW_FIRST_ATTEMPT = """\
import json, os, sys, time
print("attempt", os.environ["FLOOM_ATTEMPT"], flush=True)
if os.environ["FLOOM_ATTEMPT"] == "1":
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else {first_seconds})
outputs = {{
    "attempt": int(os.environ["FLOOM_ATTEMPT"]),
    "previous": os.environ.get("FLOOM_PREVIOUS_ATTEMPT"),
}}
open("result.json", "w").write(json.dumps({{"outputs": outputs}}))
"""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _server(data_dir: Path, drain_seconds: float) -> ServerProcess:
    return ServerProcess(data_dir, "", FLOOM_DRAIN_SECONDS=str(drain_seconds))


@pytest.fixture
def servers(data_dir: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for sp in started:
        sp.stop()


def _start_run(sp: ServerProcess, tmp_path: Path, first_seconds: float) -> str:
    folder = make_worker(
        tmp_path / "slow",
        "name: slow\nconcurrency: 1\n",
        {"run.py": SLOW_FIRST_ATTEMPT.format(first_seconds=first_seconds)},
    )
    with sp.client() as api:
        deploy_folder(api, folder)
        run_id: str = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]
        wait_until(
            lambda: any(
                e["line"] == "attempt 1"
                for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
            )
        )
    return run_id


def _stored(data_dir: Path, run_id: str) -> tuple[str, int, str | None]:
    with sqlite3.connect(data_dir / "floom.db") as db:
        row = db.execute(
            "SELECT status, attempt, error_code FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
    return row[0], row[1], row[2]


def test_sigterm_lets_a_running_run_finish_within_the_drain(
    data_dir: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    sp = _server(data_dir, drain_seconds=30)
    servers.append(sp)
    sp.start()
    run_id = _start_run(sp, tmp_path, first_seconds=2)
    with sp.client() as api:  # queued behind the first (concurrency: 1)
        waiting = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]
    sp.signal(signal.SIGTERM)
    sp.wait_exit(timeout=30)
    assert "draining: 1 run(s)" in sp.log()
    assert _stored(data_dir, run_id)[:2] == ("succeeded", 1)
    # The node stopped claiming at the signal: the run that had room during the drain waits.
    assert _stored(data_dir, waiting) == ("queued", 1, None)


def test_during_a_drain_the_api_answers_503_with_retry_after_instead_of_refusing(
    data_dir: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    sp = _server(data_dir, drain_seconds=30)
    servers.append(sp)
    sp.start()
    run_id = _start_run(sp, tmp_path, first_seconds=4)
    sp.signal(signal.SIGTERM)
    wait_until(lambda: "draining: 1 run(s)" in sp.log(), timeout=20)
    with sp.client() as api:
        for path in ("/healthz", "/api/v1/workers", f"/api/v1/runs/{run_id}"):
            answer = api.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert 1 <= int(answer.headers["Retry-After"]) <= 30
            assert answer.json()["error"]["code"] == "node_draining"
    sp.wait_exit(timeout=30)
    assert _stored(data_dir, run_id)[:2] == ("succeeded", 1)
    with pytest.raises(httpx.ConnectError), sp.client() as api:
        api.get("/healthz")  # after the drain, the node is gone


def test_a_run_still_running_when_the_drain_ends_is_requeued_and_told_so(
    data_dir: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    sp = _server(data_dir, drain_seconds=0.5)
    servers.append(sp)
    sp.start()
    run_id = _start_run(sp, tmp_path, first_seconds=120)
    sp.signal(signal.SIGTERM)
    sp.wait_exit(timeout=20)
    # Queued again as attempt 2, which costs none of the worker's retries.
    assert _stored(data_dir, run_id) == ("queued", 2, "interrupted")
    with live_server(data_dir, "") as again, again.client() as api:
        run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"attempt": 2, "previous": "interrupted"}
    assert run["previous_attempt"] == "interrupted"
    assert run["max_attempts"] == 2
    assert run["error"] is None


def test_a_second_ctrl_c_interrupts_running_runs_at_once(
    data_dir: Path, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    # Ctrl-C (SIGINT) drains as SIGTERM does; the SIGTERM tests above cover that signal.
    sp = _server(data_dir, drain_seconds=300)
    servers.append(sp)
    sp.start()
    run_id = _start_run(sp, tmp_path, first_seconds=300)
    sp.signal(signal.SIGINT)
    wait_until(lambda: "draining: 1 run(s)" in sp.log(), timeout=20)
    sp.signal(signal.SIGINT)
    sp.wait_exit(timeout=20)  # far less than the 300 s drain
    assert _stored(data_dir, run_id) == ("queued", 2, "interrupted")


def test_a_retried_attempt_is_told_the_one_before_it_failed(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "flaky",
        "name: flaky\nretries: {count: 1, backoff_seconds: 0}\n",
        {
            "run.py": "import json, os\n"
            "if os.environ['FLOOM_ATTEMPT'] == '1':\n    raise SystemExit(3)\n"
            "open('result.json', 'w').write(json.dumps({'outputs': "
            "{'previous': os.environ.get('FLOOM_PREVIOUS_ATTEMPT')}}))\n"
        },
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/flaky/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded", run
    assert (run["attempt"], run["outputs"]) == (2, {"previous": "failed"})
    assert run["previous_attempt"] == "failed"
