"""A floom server killed with kill -9 mid-run never leaves the run running forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import deploy_folder, free_port, make_worker, wait_for_run, wait_until

KEY = "flm_recovery_test_admin_key"


class ServerProcess:
    def __init__(self, data_dir: Path, database_url: str) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            FLOOM_DATA_DIR=str(self.data_dir),
            FLOOM_DATABASE_URL=self.database_url,
            FLOOM_BOOTSTRAP_API_KEY=KEY,
            FLOOM_DEPLOY_EXAMPLES="false",
            FLOOM_HEARTBEAT_SECONDS="0.2",
            FLOOM_LEASE_SECONDS="2",
            FLOOM_REAP_INTERVAL_SECONDS="0.3",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "floom.cli", "serve", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "server exited"
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=30, interval=0.1)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


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
outputs = {"attempt": int(os.environ["FLOOM_ATTEMPT"])}
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


def test_a_run_on_a_killed_server_is_retried_after_restart(
    server_process: ServerProcess, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "crashy",
        "name: crashy\nretries: {count: 1, backoff_seconds: 0}\n",
        {"run.py": SCRIPT},
    )
    server_process.start()
    with httpx.Client(
        base_url=server_process.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ) as api:
        deploy_folder(api, folder)
        run_id = api.post("/api/v1/workers/crashy/runs", json={}).json()["id"]
        wait_until(
            lambda: any(
                e["line"] == "attempt 1"
                for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
            )
        )
    server_process.kill9()
    # The sandbox dies with its parent; no orphaned worker process keeps running.
    wait_until(lambda: _no_sandbox_left(run_id), timeout=10)
    server_process.start()
    with httpx.Client(
        base_url=server_process.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ) as api:
        run = wait_for_run(api, run_id, timeout=30)
        assert run["status"] == "succeeded", run
        assert run["attempt"] == 2
        assert run["outputs"] == {"attempt": 2}
        lines = [e["line"] for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]]
        assert any("lease expired" in line and "requeued" in line for line in lines), lines


def test_a_run_without_retries_on_a_killed_server_ends_failed_not_running(
    server_process: ServerProcess, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "once", "name: once\n", {"run.py": SCRIPT})
    server_process.start()
    with httpx.Client(
        base_url=server_process.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ) as api:
        deploy_folder(api, folder)
        run_id = api.post("/api/v1/workers/once/runs", json={}).json()["id"]
        wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running")
    server_process.kill9()
    server_process.start()
    with httpx.Client(
        base_url=server_process.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ) as api:
        run = wait_for_run(api, run_id, timeout=30)
        assert run["status"] == "failed"
        assert run["error"]["code"] == "executor_lost"
