"""Soak: does the server's memory stay flat over many runs, and does storage per run stay flat?

Run from the repository root:

    .venv/bin/python bench/bench_soak.py [--runs 20000] [--baseline 1000] [--clients 4]

One process holds a real floom server (API, executor, local sandbox, SQLite in a fresh data
dir; `--database-url` for another store) served by uvicorn on a loopback port, with
tracemalloc tracing, and the clients that run workers/hello through it (each run one
`POST /workers/hello/runs?wait=30`). It reads the process's RSS and a tracemalloc snapshot
after `--baseline` runs and again at the end. Target (issue 14): RSS at the end within
5 MiB of RSS after the baseline; on a miss it prints tracemalloc's top growth. With each
RSS it prints what the SQLite library holds (its connections' page caches). It also
prints the store's bytes per run and how long listing, paging, reading logs and submitting
take at the start and at the end (flat cost per run).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from floom.services.principal import SYSTEM

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from server import free_port, rss_kib  # noqa: E402

from floom.api.app import create_app  # noqa: E402
from floom.config import Settings  # noqa: E402
from floom.services import keys  # noqa: E402
from floom.services.context import Context  # noqa: E402

GROWTH_LIMIT_MIB = 5.0
SQLITE_STATUS_MEMORY_USED = 0
TOP = 15


def rss_mib() -> float:
    return rss_kib(os.getpid()) / 1024


def traced_mib() -> float:
    return tracemalloc.get_traced_memory()[0] / 2**20


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} {five:.1f}"


def sqlite_heap() -> str:
    """What the SQLite library has allocated now and at most (its connections' page caches
    are most of it), read from libsqlite3's own counter; "?" where it cannot be read."""
    now, high = ctypes.c_int64(), ctypes.c_int64()
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
        failed = lib.sqlite3_status64(
            SQLITE_STATUS_MEMORY_USED, ctypes.byref(now), ctypes.byref(high), 0
        )
    except (OSError, AttributeError):
        return "?"
    if failed:
        return "?"
    return f"{now.value / 2**20:.1f} MiB (at most {high.value / 2**20:.1f})"


def memory(ctx: Context) -> str:
    """Where the RSS is (anonymous or file-backed), the store's pooled connections and what
    SQLite holds (each SQLite connection keeps its own page cache)."""
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    pool = ctx.engine.pool
    kept = pool.checkedin() if hasattr(pool, "checkedin") else "?"
    return (
        f"RssAnon {fields.get('RssAnon', '?').strip()}, RssFile "
        f"{fields.get('RssFile', '?').strip()}; pooled connections idle: {kept}; "
        f"SQLite heap {sqlite_heap()}"
    )


def store_bytes(data_dir: Path) -> int:
    uri = f"file:{data_dir / 'floom.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def probe_costs(client: httpx.Client, run_id: str) -> dict[str, float]:
    """Milliseconds of the calls whose cost must not grow with the number of runs."""
    costs = {}
    calls = {
        "list": lambda: client.get("/api/v1/runs", params={"limit": 50}),
        "page": lambda: client.get(
            "/api/v1/runs",
            params={"limit": 50, "cursor": client.get("/api/v1/runs").json()["next_cursor"]},
        ),
        "logs": lambda: client.get(f"/api/v1/runs/{run_id}/logs"),
        "submit": lambda: client.post("/api/v1/workers/hello/runs?wait=30", json={}),
    }
    for name, call in calls.items():
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            call().raise_for_status()
            times.append(time.perf_counter() - t0)
        costs[name] = sorted(times)[2] * 1000
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--baseline", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args(argv)
    if args.runs <= args.baseline:
        parser.error("--runs must be more than --baseline")
    tracemalloc.start(10)
    data_dir = Path(tempfile.mkdtemp(prefix="floom-soak-"))
    settings = Settings(data_dir=data_dir, deploy_examples=True, secret_key="soak-secret-key")
    ctx = Context.open(settings)
    _, token = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="soak")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(ctx=ctx), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit("soak: the server did not start")
        time.sleep(0.05)
    clients = [
        httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
            trust_env=False,
        )
        for _ in range(args.clients)
    ]
    done = [0]
    failed: list[str] = []
    lock = threading.Lock()
    last_id = [""]

    def run_some(client: httpx.Client, count: int) -> None:
        for _ in range(count):
            resp = client.post(
                "/api/v1/workers/hello/runs", params={"wait": 30}, json={"inputs": {"name": "s"}}
            )
            body = resp.json()
            with lock:
                done[0] += 1
                if "id" not in body:  # refused: the answer says why
                    failed.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                    continue
                last_id[0] = body["id"]
                if body.get("status") != "succeeded":
                    failed.append(f"{body['id']}: {body.get('status')}")

    def phase(count: int) -> None:
        per = max(1, count // args.clients)
        with ThreadPoolExecutor(args.clients) as pool:
            for f in [pool.submit(run_some, c, per) for c in clients]:
                f.result()

    try:
        t0 = time.perf_counter()
        phase(args.baseline)
        # The baseline snapshot (tens of MiB of traces) is held until the end, so it is
        # taken before the baseline reading: both RSS readings include it.
        base_snap = tracemalloc.take_snapshot()
        gc.collect()
        base_rss, base_traced = rss_mib(), traced_mib()
        base_bytes, base_runs = store_bytes(data_dir), done[0]
        base_costs = probe_costs(clients[0], last_id[0])
        elapsed = time.perf_counter() - t0
        print(f"after {done[0]} runs ({elapsed:.0f} s, {load()}): RSS {base_rss:.1f} MiB")
        print(f"  {memory(ctx)}")
        phase(args.runs - args.baseline)
        gc.collect()
        end_rss, end_traced = rss_mib(), traced_mib()
        end_snap = tracemalloc.take_snapshot()
        end_bytes = store_bytes(data_dir)
        end_costs = probe_costs(clients[0], last_id[0])
        per_run = (end_bytes - base_bytes) / max(1, done[0] - base_runs)
        elapsed = time.perf_counter() - t0
        print(f"after {done[0]} runs ({elapsed:.0f} s, {load()}): RSS {end_rss:.1f} MiB")
        print(f"  {memory(ctx)}")
        print(f"failed runs: {len(failed)}" + (f" (first: {failed[0]})" if failed else ""))
        print(f"store: {per_run:.0f} bytes per run (database pages in use)")
        for name in base_costs:
            print(f"  {name}: {base_costs[name]:.1f} ms -> {end_costs[name]:.1f} ms")
        growth = end_rss - base_rss
        ok = growth <= GROWTH_LIMIT_MIB
        verdict = "OK" if ok else "MISS"
        print(f"RSS growth {growth:+.1f} MiB, target <= {GROWTH_LIMIT_MIB:g}: {verdict}")
        # Python's own heap, which RSS can hide (freed memory is reused before RSS grows).
        traced = end_traced - base_traced
        print(f"traced Python memory growth {traced:+.1f} MiB")
        if not ok or traced > GROWTH_LIMIT_MIB:
            print(f"tracemalloc top {TOP} growth since the baseline:")
            for stat in end_snap.compare_to(base_snap, "lineno")[:TOP]:
                print(f"  {stat}")
    finally:
        for c in clients:
            c.close()
        server.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
