"""REST behaviour: deploy errors, versions, rollback, replay, pagination, SSE, error shape."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from floom.api.routes import runs as routes_runs
from floom.bundle import read_folder
from floom.services.runs.statuses import ACTIVE
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    make_worker,
    wait_for_run,
)


def _archive(folder: Path) -> bytes:
    return read_folder(folder, max_bytes=10**8).to_archive()


def test_a_broken_manifest_is_refused_with_every_problem_and_nothing_deployed(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "bad",
        "name: Bad Name\ntimeout: 5\ninputs:\n  x: {type: strng}\n",
        {"run.py": "print(1)\n"},
    )
    resp = api.post("/api/v1/workers", content=_archive(folder))
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "manifest_invalid"
    paths = {p["path"] for p in err["details"]}
    assert {"name", "timeout", "inputs.x.type"} <= paths
    assert api.get("/api/v1/workers").json()["items"] == []
    checked = api.post("/api/v1/workers/validate", content=_archive(folder)).json()
    assert checked["valid"] is False
    assert len(checked["problems"]) >= 3


def test_an_unsafe_or_unreadable_archive_is_refused(api: httpx.Client) -> None:
    resp = api.post("/api/v1/workers", content=b"not a tarball")
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "bundle_invalid"
    assert resp.json()["error"]["hint"]


def test_rollback_makes_an_earlier_version_active_and_runs_follow_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    manifest = "name: ver\noutputs: {v: {type: integer}}\n"
    script = 'import json; open("result.json","w").write(json.dumps({{"outputs": {{"v": {n}}}}}))\n'
    folder = make_worker(tmp_path / "ver", manifest, {"run.py": script.format(n=1)})
    v1 = deploy_folder(api, folder)["version"]["id"]
    (folder / "run.py").write_text(script.format(n=2))
    v2 = deploy_folder(api, folder)["version"]["id"]
    assert v1 != v2
    r2 = wait_for_run(api, api.post("/api/v1/workers/ver/runs", json={}).json()["id"])
    assert r2["outputs"] == {"v": 2}

    back = api.post("/api/v1/workers/ver/rollback", json={"version_id": v1})
    assert back.status_code == 200
    assert back.json()["worker"]["active_version_id"] == v1
    r1 = wait_for_run(api, api.post("/api/v1/workers/ver/runs", json={}).json()["id"])
    assert (r1["version_id"], r1["outputs"]) == (v1, {"v": 1})

    # Rollback by run: make the version of r2 active again.
    by_run = api.post("/api/v1/workers/ver/rollback", json={"run_id": r2["id"]})
    assert by_run.json()["worker"]["active_version_id"] == v2
    # Again to the version already active: a quiet success that changes nothing.
    again = api.post("/api/v1/workers/ver/rollback", json={"run_id": r2["id"]})
    assert again.status_code == 200
    assert again.json()["changed"] is False
    assert again.json()["worker"]["active_version_id"] == v2
    missing = api.post("/api/v1/workers/ver/rollback", json={"version_id": "vnope"})
    assert missing.status_code == 404

    # Replay is pinned to the run's version unless asked for the latest.
    replay = api.post(f"/api/v1/runs/{r1['id']}/replay").json()
    assert (replay["version_id"], replay["replay_of"], replay["trigger"]) == (
        v1,
        r1["id"],
        "replay",
    )
    latest = api.post(f"/api/v1/runs/{r1['id']}/replay", json={"latest": True}).json()
    assert latest["version_id"] == v2
    assert wait_for_run(api, latest["id"])["outputs"] == {"v": 2}


def test_run_lists_page_by_cursor_newest_first_and_filter(api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    ids = [
        api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": str(i)}}).json()["id"]
        for i in range(5)
    ]
    for run_id in ids:
        wait_for_run(api, run_id)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 2, "worker": "hello"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/api/v1/runs", params=params).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    assert api.get("/api/v1/runs", params={"status": "failed"}).json()["items"] == []
    bad = api.get("/api/v1/runs", params={"status": "exploded"})
    assert bad.status_code == 400
    assert "succeeded" in bad.json()["error"]["hint"]


def _read_log_stream(
    api: httpx.Client, run_id: str, *, after: int, timeout: float
) -> tuple[list[dict[str, object]], dict[str, object] | None]:
    """A run's log events after `after` from its event stream, and the run of its `end` event
    (None if the stream closed without one)."""
    got: list[dict[str, object]] = []
    end = None
    with api.stream(
        "GET", f"/api/v1/runs/{run_id}/logs/stream", params={"after": after}, timeout=timeout
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "end":
                    end = data
                    break
                got.append(data)
    return got, end


def test_sse_log_stream_delivers_ordered_lines_then_ends_and_resumes(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "counter",
        "name: counter\n",
        {
            "run.py": "import time\nfor i in range(5):\n"
            "    print(i, flush=True)\n    time.sleep(0.05)\n"
        },
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/counter/runs", json={}).json()["id"]

    events, end = _read_log_stream(api, run_id, after=0, timeout=30)
    assert end is not None
    assert end["status"] == "succeeded"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["line"] for e in events if e["stream"] == "stdout"] == ["0", "1", "2", "3", "4"]
    resumed, _ = _read_log_stream(api, run_id, after=events[2]["seq"], timeout=30)  # type: ignore[arg-type]
    assert resumed == events[3:]


def test_a_followed_run_s_end_ends_its_stream_without_waiting_out_the_poll(
    api: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A poll longer than the client's patience: only the run's end waking the stream can end
    # it in time.
    monkeypatch.setattr(routes_runs, "SSE_POLL_SECONDS", 120.0)
    folder = make_worker(
        tmp_path / "slow",
        "name: slow\n",
        {"run.py": "import time\ntime.sleep(1.5)\nprint('done', flush=True)\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]

    events, end = _read_log_stream(api, run_id, after=0, timeout=20)
    assert end is not None
    assert end["status"] == "succeeded"
    assert "done" in [e["line"] for e in events]


def test_errors_have_one_shape(server: LiveServer, api: httpx.Client) -> None:
    for resp in [
        api.get("/api/v1/runs/run_nope"),
        api.get("/api/v1/workers/nope"),
        api.get("/api/v1/nothing-here"),
        api.post("/api/v1/workers/hello/runs", content=b"{not json"),
    ]:
        body = resp.json()
        assert resp.status_code >= 400
        assert set(body["error"]) >= {"code", "message", "hint"}, body


def test_cancelling_a_finished_run_is_a_conflict(api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run = wait_for_run(api, api.post("/api/v1/workers/hello/runs", json={}).json()["id"])
    resp = api.post(f"/api/v1/runs/{run['id']}/cancel")
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "conflict"


def test_outputs_that_break_the_manifest_fail_the_run(api: httpx.Client, tmp_path: Path) -> None:
    folder = make_worker(
        tmp_path / "liar",
        "name: liar\noutputs: {n: {type: integer, required: true}}\n",
        {
            "run.py": "import json\n"
            'open("result.json", "w").write(json.dumps({"outputs": {"n": "x"}}))\n'
        },
    )
    deploy_folder(api, folder)
    run = wait_for_run(api, api.post("/api/v1/workers/liar/runs", json={}).json()["id"])
    assert run["status"] == "failed"
    assert run["error"]["code"] == "outputs_invalid"
    assert "outputs.n" in run["error"]["message"]


def test_a_worker_error_in_result_json_fails_the_run_with_that_message(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "sad",
        "name: sad\nretries: 3\n",
        {
            "run.py": "import json\nopen('result.json','w').write(json.dumps("
            "{'error': 'upstream said no', 'retryable': False}))\n"
        },
    )
    deploy_folder(api, folder)
    run = wait_for_run(api, api.post("/api/v1/workers/sad/runs", json={}).json()["id"])
    assert (run["status"], run["attempt"]) == ("failed", 1)
    assert run["error"] == {"code": "worker_error", "message": "upstream said no"}


def test_get_run_with_wait_returns_once_the_run_has_ended(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "pause",
        "name: pause\n",
        {"run.py": "import time\ntime.sleep(0.5)\nprint('done')\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/pause/runs", json={}).json()["id"]
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] in ACTIVE
    ended = api.get(f"/api/v1/runs/{run_id}", params={"wait": 20}, timeout=30).json()
    assert ended["status"] == "succeeded"
    too_long = api.get(f"/api/v1/runs/{run_id}", params={"wait": 61})
    assert too_long.status_code == 422
