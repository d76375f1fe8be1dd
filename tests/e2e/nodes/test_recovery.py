"""A floom server killed with kill -9 mid-run never leaves the run running forever."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import deploy_folder, make_worker, wait_for_run, wait_until
from tests.support.processes.server_process import ServerProcess


@pytest.fixture
def server_process(tmp_path: Path, database_url: str) -> Iterator[ServerProcess]:
    sp = ServerProcess(tmp_path / "data", database_url)
    try:
        yield sp
    finally:
        sp.stop()


SCRIPT = """\
import os, time, json
print("attempt", os.environ["FLOOM_ATTEMPT"], flush=True)
if os.environ["FLOOM_ATTEMPT"] == "1":
    time.sleep(120)
outputs = {
    "attempt": int(os.environ["FLOOM_ATTEMPT"]),
    "previous": os.environ.get("FLOOM_PREVIOUS_ATTEMPT"),
}
open("result.json", "w").write(json.dumps({"outputs": outputs}))
"""


def _no_sandbox_left(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                return False
        except OSError:
            continue
    return True


def _attempt_1_started(api: httpx.Client, run_id: str) -> bool:
    lines = api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
    return any(e["line"] == "attempt 1" for e in lines)


def test_runs_on_a_killed_server_are_retried_or_failed_by_their_policy_after_restart(
    server_process: ServerProcess, tmp_path: Path
) -> None:
    crashy = make_worker(
        tmp_path / "crashy",
        "name: crashy\nretries: {count: 1, backoff_seconds: 0}\n",
        {"run.py": SCRIPT},
    )
    once = make_worker(tmp_path / "once", "name: once\n", {"run.py": SCRIPT})
    server_process.start()
    with server_process.client() as api:
        deploy_folder(api, crashy)
        deploy_folder(api, once)
        retried = api.post("/api/v1/workers/crashy/runs", json={}).json()["id"]
        lost = api.post("/api/v1/workers/once/runs", json={}).json()["id"]
        wait_until(lambda: _attempt_1_started(api, retried) and _attempt_1_started(api, lost))
    server_process.kill9()
    # The sandboxes die with their parent; no orphaned worker process keeps running.
    wait_until(lambda: _no_sandbox_left(retried) and _no_sandbox_left(lost), timeout=10)
    server_process.start()
    with server_process.client() as api:
        run = wait_for_run(api, retried, timeout=30)
        assert run["status"] == "succeeded", run
        assert run["attempt"] == 2
        # The script is told its node died under the attempt before (it may have acted).
        assert run["outputs"] == {"attempt": 2, "previous": "lost"}
        assert run["previous_attempt"] == "lost"  # kept once the run has ended
        lines = [e["line"] for e in api.get(f"/api/v1/runs/{retried}/logs").json()["items"]]
        assert any("lease expired" in line and "requeued" in line for line in lines), lines
        # Without retries the run ends failed, not running forever.
        failed = wait_for_run(api, lost, timeout=30)
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "executor_lost"
