"""A `floom serve` of its own, as a subprocess, for tests of what a process does when it is
killed, signalled or restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.harness import free_port, plain_client, wait_until

KEY = "flm_server_process_test_admin_key"


def wait_healthy(proc: subprocess.Popen[bytes], url: str, *, timeout: float) -> None:
    """Until the `floom serve` process `proc` answers /healthz at `url`; fails at once if it
    exits."""
    with plain_client(url, timeout=1) as probe:

        def healthy() -> bool:
            assert proc.poll() is None, f"the floom process at {url} exited"
            try:
                return probe.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=timeout, interval=0.1)


class ServerProcess:
    """`floom serve` on a free loopback port with fast leases; `env` adds FLOOM_* settings.
    Its stderr (the server's log) is kept in `log_path`, and its stdout too with
    `keep_stdout`."""

    def __init__(
        self, data_dir: Path, database_url: str, *, keep_stdout: bool = False, **env: str
    ) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.keep_stdout = keep_stdout
        self.env = env
        self.port = free_port()
        self.log_path = data_dir.parent / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return plain_client(self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

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
            FLOOM_POLL_INTERVAL_SECONDS="0.05",
        )
        env.update(self.env)
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "floom.cli", "serve", "--port", str(self.port)],
                env=env,
                stdout=log_file if self.keep_stdout else subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )

        wait_healthy(self.proc, self.url, timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> None:
        assert self.proc is not None
        self.proc.wait(timeout=timeout)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait_exit(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
