"""Runs end to end through the REST API, on SQLite and PostgreSQL: queue, sandbox, logs."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    make_worker,
    wait_for_run,
    wait_until,
)


def test_hello_runs_from_inputs_to_outputs_with_logs_and_an_artifact(api: httpx.Client) -> None:
    deployed = deploy_folder(api, EXAMPLES / "hello")
    assert deployed["created"] is True
    resp = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "Ada"}})
    assert resp.status_code == 202
    run = wait_for_run(api, resp.json()["id"])
    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"greeting": "Hello, Ada!", "length": 11}
    assert run["version_id"] == deployed["version"]["id"]
    assert [a["name"] for a in run["artifacts"]] == ["greeting.txt"]
    art = api.get(run["artifacts"][0]["url"])
    assert art.text == "Hello, Ada!\n"
    logs = api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]
    assert [e["seq"] for e in logs] == list(range(1, len(logs) + 1))
    assert ("stdout", "Hello, Ada!") in [(e["stream"], e["line"]) for e in logs]


def test_deploying_the_same_content_twice_gives_the_same_version(api: httpx.Client) -> None:
    first = deploy_folder(api, EXAMPLES / "hello")
    second = deploy_folder(api, EXAMPLES / "hello")
    assert second["version"]["id"] == first["version"]["id"]
    assert second["created"] is False
    versions = api.get("/api/v1/workers/hello/versions").json()["items"]
    assert len(versions) == 1


def test_a_bad_input_is_refused_with_the_field_named_and_no_run_created(
    api: httpx.Client,
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    resp = api.post(
        "/api/v1/workers/hello/runs", json={"inputs": {"times": "abc"}, "coerce_strings": True}
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "input_invalid"
    assert "times" in resp.json()["error"]["message"]
    assert api.get("/api/v1/runs", params={"worker": "hello"}).json()["items"] == []


def test_a_shell_worker_runs(api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "sysinfo")
    run_id = api.post("/api/v1/workers/sysinfo/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded", run
    assert run["outputs"]["hostname"] == "floom"


def test_a_timeout_kills_the_run_and_records_timed_out(api: httpx.Client, tmp_path: Path) -> None:
    folder = make_worker(
        tmp_path / "slow",
        "name: slow\nlimits: {timeout_seconds: 1}\n",
        {"run.py": "import time\nprint('started', flush=True)\ntime.sleep(60)\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id, timeout=20)
    assert run["status"] == "timed_out"
    assert run["error"] == {
        "code": "timed_out",
        "message": "timed out after 1s (limits.timeout_seconds in worker.yml)",
    }


def test_cancel_stops_a_running_run(api: httpx.Client, tmp_path: Path) -> None:
    folder = make_worker(
        tmp_path / "sleepy",
        "name: sleepy\n",
        {"run.py": "import time\nprint('waiting', flush=True)\ntime.sleep(60)\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/sleepy/runs", json={}).json()["id"]
    wait_until(
        lambda: any(
            e["line"] == "waiting" for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
        )
    )
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    run = wait_for_run(api, run_id, timeout=10)
    assert run["status"] == "cancelled"


def test_a_failing_script_is_retried_by_its_policy_then_fails(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "flaky",
        "name: flaky\nretries: {count: 2, backoff_seconds: 0}\n",
        {"run.py": "import os, sys\nprint('attempt', os.environ['FLOOM_ATTEMPT'])\nsys.exit(3)\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/flaky/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "failed"
    assert run["attempt"] == 3
    assert run["error"]["code"] == "exit_code"
    events = api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
    assert [e["line"] for e in events if e["stream"] == "stdout"] == [
        "attempt 1",
        "attempt 2",
        "attempt 3",
    ]


def test_server_fixture_is_live(server: LiveServer) -> None:
    with server.client() as c:
        assert c.get("/healthz").json()["status"] == "ok"
