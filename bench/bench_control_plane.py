"""The control plane alone, to saturation: floom nodes on one PostgreSQL whose sandbox is the
in-memory fake (bench/fake_node.py: no process per run, 20 log lines), so what is measured is
the API, the queue, leases, logs and the store.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, trust auth):

    .venv/bin/python bench/bench_control_plane.py [--runs 600] [--nodes 1,2,4]

For 1, 2 and 4 executor nodes (processes, 8 slots each) beside one api node, on a fresh
database each time: `--runs` runs are queued at once by 8 client threads and the time until
the last one ended gives runs per second (the queue always holds more than the slots: the
executors run at saturation). Also the PostgreSQL CPU per run (this database's backends,
/proc) and the connections the nodes hold. Prints the figures; asserts only that every run
succeeded.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from floom.bundle import read_folder  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
KEY = "flm_bench_cp_" + uuid.uuid4().hex
CLOCK = os.sysconf("SC_CLK_TCK")
SLOTS = 8


def admin(sql: str, *args: Any, db: str = "postgres") -> Any:
    with psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + f"/{db}", autocommit=True) as conn:
        cur = conn.execute(sql, args or None)
        return cur.fetchall() if cur.description else None


def backend_cpu(db: str) -> tuple[float, int]:
    total, count = 0.0, 0
    for (pid,) in admin("SELECT pid FROM pg_stat_activity WHERE datname = %s", db):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK
            count += 1
        except (OSError, ValueError, IndexError):
            continue
    return total, count


class Node:
    def __init__(self, root: Path, name: str, url: str, roles: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            PYTHONPATH=str(REPO),
            FLOOM_DATA_DIR=str(root / name),
            FLOOM_DATABASE_URL=url,
            FLOOM_NODE_ID=name,
            FLOOM_ROLES=roles,
            FLOOM_SANDBOX="fake",
            FLOOM_EXECUTOR_SLOTS=str(SLOTS),
            FLOOM_BOOTSTRAP_API_KEY=KEY,
            FLOOM_SECRET_KEY="bench-secret-key",
            FLOOM_DEPLOY_EXAMPLES="false",
            FLOOM_RATE_LIMIT_PER_MINUTE="0",
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "fake_node.py"),
                "serve",
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / f"{name}.log", "wb"),  # noqa: SIM115 - closed with the process
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"bench: node {name} exited; see {root / (name + '.log')}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: node {name} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def measure(root: Path, executors: int, runs: int) -> dict[str, float]:
    db = f"floom_cp_{uuid.uuid4().hex[:8]}"
    admin(f'CREATE DATABASE "{db}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
    try:
        with ExitStack() as stack:
            api = Node(root, f"api{executors}", url, "api,scheduler")
            stack.callback(api.stop)
            for i in range(executors):
                node = Node(root, f"x{executors}-{i}", url, "executor")
                stack.callback(node.stop)
            http = httpx.Client(
                base_url=api.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
            )
            stack.callback(http.close)
            folder = root / "trivial"
            folder.mkdir(exist_ok=True)
            (folder / "worker.yml").write_text("name: trivial\n")
            (folder / "run.py").write_text("print('never run: the fake sandbox answers')\n")
            archive = read_folder(folder, max_bytes=1 << 20).to_archive()
            http.post(
                "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
            )
            warm = [
                http.post("/api/v1/workers/trivial/runs", json={"inputs": {}}).json()["id"]
                for _ in range(executors * 2)
            ]
            wait_ended(http, warm)
            cpu0, _ = backend_cpu(db)
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                ids = list(
                    pool.map(
                        lambda _: http.post(
                            "/api/v1/workers/trivial/runs", json={"inputs": {}}
                        ).json()["id"],
                        range(runs),
                    )
                )
            queued = time.monotonic() - t0
            wait_ended(http, ids)
            took = time.monotonic() - t0
            cpu1, connections = backend_cpu(db)
            return {
                "runs/s": runs / took,
                "queue runs/s": runs / queued,
                "pg_cpu_ms": (cpu1 - cpu0) * 1000 / runs,
                "pg_busy": (cpu1 - cpu0) / took,
                "connections": connections,
            }
    finally:
        admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def wait_ended(http: httpx.Client, ids: list[str]) -> None:
    wanted = set(ids)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        done = admin_count(http, wanted)
        if done >= len(wanted):
            return
        time.sleep(0.2)
    raise SystemExit("bench: runs did not end in 900 s")


def admin_count(http: httpx.Client, wanted: set[str]) -> int:
    ended = 0
    cursor = None
    while True:
        params: dict[str, Any] = {"worker": "trivial", "limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/api/v1/runs", params=params).json()
        for r in page["items"]:
            if r["id"] in wanted and r["status"] in ("succeeded", "failed", "cancelled"):
                if r["status"] != "succeeded":
                    raise SystemExit(f"bench: run {r['id']} ended {r['status']}")
                ended += 1
        cursor = page.get("next_cursor")
        if not cursor:
            return ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--nodes", default="1,2,4")
    args = parser.parse_args(argv)
    print(
        f"control plane: {args.runs} runs queued at once, fake sandbox, {SLOTS} slots a node; "
        f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores",
        flush=True,
    )
    found = {}
    with tempfile.TemporaryDirectory(prefix="floom-bench-cp-") as tmp:
        for n in (int(x) for x in args.nodes.split(",")):
            found[n] = measure(Path(tmp), n, args.runs)
            f = found[n]
            print(
                f"  {n} executor node(s): {f['runs/s']:6.1f} runs/s (queued at "
                f"{f['queue runs/s']:6.1f}/s), PostgreSQL {f['pg_cpu_ms']:5.2f} ms CPU per run, "
                f"{f['pg_busy']:4.2f} cores busy, {f['connections']:.0f} connections",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
