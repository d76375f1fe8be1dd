"""The systems the bench runs workers/hello on, behind one shape: `one(lane)` runs it once and
returns the client-observed seconds (raising unless it succeeded), `burst(total)` queues
`total` runs at once and returns when all have succeeded, `cpu()` reads the CPU seconds of
the system's own processes (the sandboxes excluded)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from floor import FloorSlot
from server import VENV_BIN, Server, proc_cpu_seconds, tree_cpu_seconds

from floom.services.runs.rules import FINISHED, SUCCEEDED

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WAIT_SECONDS = 30.0
RUN_DEADLINE_SECONDS = 60.0
BURST_DEADLINE_SECONDS = 300.0
LANES = 4  # the most clients any phase uses


class Floor:
    """Bubblewrap with floom's own flags, one private work dir per lane."""

    name = "floor"

    def __init__(self, root: Path, slots: int) -> None:
        self.lanes = [FloorSlot(root, f"lane{i}") for i in range(max(LANES, slots))]
        self.slots = slots
        self.command = self.lanes[0].describe()

    def one(self, lane: int) -> float:
        return self.lanes[lane].run_once()

    def burst(self, total: int) -> None:
        # As many at once as floom's executor runs (executor_slots): the same parallelism.
        left = [total]
        lock = threading.Lock()

        def drain(slot: FloorSlot) -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                slot.run_once()

        with ThreadPoolExecutor(self.slots) as pool:
            for f in [pool.submit(drain, s) for s in self.lanes[: self.slots]]:
                f.result()

    def cpu(self) -> float:
        return 0.0  # no process of its own besides the sandbox


class Floom:
    """A real `floom serve`; a run is `POST /workers/hello/runs?wait=` (one round trip when the
    server supports it, else it goes on with `GET /runs/{id}?wait=`)."""

    def __init__(self, name: str, server: Server, *, worker: str = "hello") -> None:
        self.name = name
        self.server = server
        self.worker = worker
        self.clients = [server.new_client() for _ in range(LANES)]
        self.run_ids: list[str] = []
        self._lock = threading.Lock()

    def _start(self, client: httpx.Client, wait: float) -> dict[str, Any]:
        params = {"wait": f"{wait:g}"} if wait else None
        resp = client.post(
            f"/api/v1/workers/{self.worker}/runs",
            params=params,
            json={"inputs": {"name": "bench"}},
            timeout=wait + 30,
        )
        if resp.status_code not in (200, 202):
            raise RuntimeError(f"POST runs answered {resp.status_code}: {resp.text[:300]}")
        body: dict[str, Any] = resp.json()
        with self._lock:
            self.run_ids.append(body["id"])
        return body

    def _until_end(self, client: httpx.Client, run: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + RUN_DEADLINE_SECONDS
        while run.get("status") not in FINISHED:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run['id']} not finished in {RUN_DEADLINE_SECONDS:g} s")
            run = client.get(
                f"/api/v1/runs/{run['id']}",
                params={"wait": f"{WAIT_SECONDS:g}"},
                timeout=WAIT_SECONDS + 30,
            ).json()
        if run["status"] != SUCCEEDED or run["outputs"]["greeting"] != "Hello, bench!":
            raise RuntimeError(f"run {run['id']} did not succeed: {run}")
        return run

    def one(self, lane: int) -> float:
        client = self.clients[lane]
        t0 = time.perf_counter()
        self._until_end(client, self._start(client, WAIT_SECONDS))
        return time.perf_counter() - t0

    def burst(self, total: int) -> None:
        ids: list[dict[str, Any]] = []
        with ThreadPoolExecutor(LANES) as pool:
            ids = list(pool.map(lambda i: self._start(self.clients[i % LANES], 0), range(total)))
        deadline = time.monotonic() + BURST_DEADLINE_SECONDS
        for run in ids:
            if time.monotonic() > deadline:
                raise RuntimeError("the burst did not finish in time")
            self._until_end(self.clients[0], run)

    def cpu(self) -> float:
        return proc_cpu_seconds(self.server.proc.pid)

    def close(self) -> None:
        for c in self.clients:
            c.close()


class CeleryStack:
    """A Celery worker (prefork, `slots` children) on Redis, whose task runs the floor's
    command (bench/celery_stack.py); a run is `run_hello.delay().get()`."""

    name = "celery"

    def __init__(self, root: Path, slots: int) -> None:
        queue = f"floom_bench_{uuid.uuid4().hex[:8]}"
        os.environ["BENCH_CELERY_QUEUE"] = queue  # read when celery_stack is imported
        os.environ["BENCH_ROOT"] = str(root)
        import celery_stack  # configured by the environment set just above

        self.task = celery_stack.run_hello
        self.app = celery_stack.app
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(REPO)])}
        self.log = (root / "celery.log").open("wb")
        argv = [str(VENV_BIN / "celery"), "-A", "celery_stack", "worker", "--pool", "prefork"]
        argv += ["--concurrency", str(slots), "-Q", queue, "-l", "warning"]
        argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        self.proc = subprocess.Popen(
            argv, cwd=BENCH, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        # Each child records its command on its first task: warm every child up.
        with ThreadPoolExecutor(slots) as pool:
            list(pool.map(lambda _: self.one(0), range(slots * 2)))

    def one(self, lane: int) -> float:
        t0 = time.perf_counter()
        outputs = self.task.delay().get(timeout=RUN_DEADLINE_SECONDS)
        elapsed = time.perf_counter() - t0
        if outputs.get("greeting") != "Hello, bench!":
            raise RuntimeError(f"celery run gave {outputs}")
        return elapsed

    def burst(self, total: int) -> None:
        pending = [self.task.delay() for _ in range(total)]
        for result in pending:
            if result.get(timeout=BURST_DEADLINE_SECONDS).get("greeting") != "Hello, bench!":
                raise RuntimeError("a celery run gave unexpected outputs")

    def cpu(self) -> float:
        return tree_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def celery_missing() -> str | None:
    """Why the Celery column cannot be measured here, or None."""
    try:
        import celery  # noqa: F401 - only to learn whether the bench extra is installed
        import redis
    except ImportError:
        return "celery or redis is not installed (pip install floom[bench])"
    try:
        redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")).ping()
    except Exception as exc:  # any failure to reach Redis means: skip the column
        return f"Redis is not reachable on 127.0.0.1:6379 ({type(exc).__name__})"
    return None


def python_version() -> str:
    return sys.version.split()[0]
