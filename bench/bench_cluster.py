"""Benchmark: several floom nodes on one PostgreSQL.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, trust auth, as in the tests):

    .venv/bin/python bench/bench_cluster.py [--runs N] [--throughput-runs M]

It starts `floom serve` processes on a fresh database: one node with the `api` role and
executor nodes with the `executor` role only, and measures

1. cross-node trigger-to-start latency: a trivial run queued on the api node and started on
   an idle executor node (the run's started_at minus its created_at), N sequential runs,
   with FLOOM_SIGNALS off (the executor finds the run at its next poll, every
   FLOOM_POLL_INTERVAL_SECONDS, default 0.5 s: how floom worked before the wake-ups) and on
   (LISTEN/NOTIFY wakes it);
2. throughput of M trivial runs queued at once on the api node, with one and with two
   executor nodes (signals on): runs per second from the first submit to the last end.

It prints the figures and asserts nothing. All traffic goes to 127.0.0.1; every wait has a
deadline; every node is stopped with SIGINT, then killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from floom.bundle import read_folder  # noqa: E402
from floom.services.runs.statuses import FINISHED  # noqa: E402

PG_ADMIN_URL = os.environ.get("FLOOM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
KEY = "flm_bench_cluster_" + uuid.uuid4().hex
TRIVIAL = {
    "worker.yml": "name: trivial\nlimits:\n  timeout_seconds: 30\n",
    "run.py": 'import json\nopen("result.json", "w").write(json.dumps({"outputs": {}}))\n',
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not reached within {timeout:.0f}s")
        time.sleep(0.05)


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"floom_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Node:
    def __init__(self, root: Path, name: str, database_url: str, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            PYTHONPATH=str(REPO),
            FLOOM_DATA_DIR=str(root / name),
            FLOOM_DATABASE_URL=database_url,
            FLOOM_NODE_ID=name,
            FLOOM_BOOTSTRAP_API_KEY=KEY,
            FLOOM_SECRET_KEY="bench-secret-key",
            FLOOM_DEPLOY_EXAMPLES="false",
            FLOOM_RATE_LIMIT_PER_MINUTE="0",
        )
        env.update({f"FLOOM_{k.upper()}": v for k, v in settings.items()})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "floom.cli", "serve", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / f"{name}.log", "wb"),  # noqa: SIM115 - closed with the process
            start_new_session=True,
        )

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"bench: a node exited (code {self.proc.returncode}); see its log")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@contextmanager
def cluster(root: Path, database_url: str, executors: int, **settings: str) -> Iterator[Node]:
    """An api node and `executors` executor nodes; yields the api node."""
    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        api = Node(root, "api", database_url, roles="api", **settings)
        stack.callback(api.stop)
        wait_until(api.healthy, timeout=90, what="the api node's start")
        for i in range(executors):
            node = Node(root, f"exec{i}", database_url, roles="executor", **settings)
            stack.callback(node.stop)
            wait_until(node.healthy, timeout=90, what="an executor node's start")
        yield api


def client(api: Node) -> httpx.Client:
    return httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30, trust_env=False
    )


def deploy_trivial(http: httpx.Client, root: Path) -> None:
    folder = root / "trivial"
    folder.mkdir(exist_ok=True)
    for name, text in TRIVIAL.items():
        (folder / name).write_text(text)
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    resp = http.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    if resp.status_code not in (200, 201):
        raise SystemExit(f"bench: deploy failed: {resp.text}")


def finished(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = http.get(f"/api/v1/runs/{run_id}").json()
    return body if body["status"] in FINISHED else None


def start_latencies(http: httpx.Client, runs: int) -> list[float]:
    """Milliseconds from queued (api node) to started (executor node), run by run."""
    out = []
    for _ in range(runs):
        run_id = http.post("/api/v1/workers/trivial/runs", json={"inputs": {}}).json()["id"]
        body = wait_until(partial(finished, http, run_id), timeout=60, what="a run's end")
        started = datetime.fromisoformat(body["started_at"])
        created = datetime.fromisoformat(body["created_at"])
        out.append((started - created).total_seconds() * 1000)
    return out


def throughput(http: httpx.Client, runs: int) -> float:
    """Runs per second: M runs queued at once by 4 clients, until the last one ends."""
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        ids = list(
            pool.map(
                lambda _: http.post("/api/v1/workers/trivial/runs", json={"inputs": {}}).json()[
                    "id"
                ],
                range(runs),
            )
        )

    def all_done() -> bool:
        page = http.get(
            "/api/v1/runs", params={"worker": "trivial", "status": "succeeded", "limit": 500}
        ).json()
        return len({r["id"] for r in page["items"]} & set(ids)) == runs

    wait_until(all_done, timeout=600, what="the end of the throughput runs")
    return runs / (time.monotonic() - started)


def summary(ms: list[float]) -> str:
    ordered = sorted(ms)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"median {statistics.median(ms):7.1f} ms   p95 {p95:7.1f} ms   max {max(ms):7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="sequential runs per latency pass")
    parser.add_argument("--throughput-runs", type=int, default=100, help="runs queued at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="floom-bench-cluster-") as tmp:
        root = Path(tmp)
        latency: dict[str, list[float]] = {}
        for label, signals in (("polling only (before)", "false"), ("wake-ups (after)", "true")):
            with (
                fresh_database() as url,
                cluster(root / signals, url, 1, signals=signals) as api,
                client(api) as http,
            ):
                deploy_trivial(http, root)
                start_latencies(http, 2)  # warm-up: first sandbox, caches
                latency[label] = start_latencies(http, args.runs)
        rates: dict[int, float] = {}
        for executors in (1, 2):
            with (
                fresh_database() as url,
                cluster(root / f"t{executors}", url, executors) as api,
                client(api) as http,
            ):
                deploy_trivial(http, root)
                start_latencies(http, 2)
                rates[executors] = throughput(http, args.throughput_runs)
    print(f"cross-node trigger-to-start latency, {args.runs} sequential runs")
    for label, ms in latency.items():
        print(f"  {label:24} {summary(ms)}")
    before, after = (statistics.median(v) for v in latency.values())
    print(f"  median ratio before/after: {before / max(after, 0.001):.1f}x")
    print(f"throughput of {args.throughput_runs} trivial runs queued at once (4 slots a node)")
    for executors, rate in rates.items():
        print(f"  {executors} executor node{'s' if executors > 1 else ' '}  {rate:6.1f} runs/s")
    print(f"  ratio 2 nodes / 1 node: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
