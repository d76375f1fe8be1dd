"""floom nodes as processes of their own on one database, for the cluster tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.harness import free_port
from tests.support.processes.server_process import wait_healthy


class NodeProcess:
    """`floom serve` in a subprocess with FLOOM_* settings of its own."""

    def __init__(self, data_dir: Path, database_url: str, **settings: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        self.env.update(
            FLOOM_DATA_DIR=str(data_dir),
            FLOOM_DATABASE_URL=database_url,
            FLOOM_SECRET_KEY="test-secret-key",
            FLOOM_DEPLOY_EXAMPLES="false",
            FLOOM_HEARTBEAT_SECONDS="0.5",
            FLOOM_POLL_INTERVAL_SECONDS="0.05",
        )
        self.env.update({f"FLOOM_{k.upper()}": v for k, v in settings.items()})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def log(self) -> str:
        """What the node has written to stderr so far (its log)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NodeProcess:
        # The node keeps its own copy of the log's descriptor; this one closes at once.
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "floom.cli", "serve", "--port", str(self.port)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        return self

    def wait_healthy(self) -> None:
        assert self.proc is not None
        wait_healthy(self.proc, self.url, timeout=90)  # start-ups overlap on 2 cores

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextmanager
def node_processes(
    root: Path, database_url: str, count: int, **settings: str
) -> Iterator[list[NodeProcess]]:
    """`count` nodes started together (their start-ups overlap), stopped on exit."""
    with ExitStack() as stack:
        nodes = []
        for i in range(count):
            node = NodeProcess(root / f"node{i}", database_url, node_id=f"node{i}", **settings)
            stack.callback(node.stop)
            nodes.append(node.start())
        for node in nodes:
            node.wait_healthy()
        yield nodes
