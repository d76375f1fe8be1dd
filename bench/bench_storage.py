"""Storage at scale: do listing, paging, reading logs and submitting cost the same with 50,000
runs stored as with 1,000, and how many bytes does a run take?

Run from the repository root:

    .venv/bin/python bench/bench_storage.py [--runs 50000] [--baseline 1000] [--postgres]

For each store (SQLite; PostgreSQL too with --postgres, on a fresh database) a real `floom
serve` runs workers/hello a few times, so that the store holds real runs, their log lines and
their artifacts. The server is then stopped and the store filled up to `--baseline` runs by
copying those runs' rows (run, log lines, artifact rows) under new ids and times, as a
stream of finished runs would leave them; the server is started again and the calls are
timed (milliseconds, median of 9 after a warm-up): a page of runs, the next page through its
cursor, a run's logs, and a new run with `?wait`. Then the store is filled up to `--runs`
and the same calls are timed again by a server started afresh. Target (issue 14): each
call's cost at `--runs` within 1.5x of its cost at `--baseline` (plus 2 ms of slack for
timer noise on a shared machine). Bytes per run: the store's growth over the fill, per run.
The soak (bench_soak.py) runs every run for real; this bench reaches 50,000 in minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_runs import pg_database, storage_bytes
from server import Server, proc_cpu_seconds
from sqlalchemy import insert, select

from floom.store.db import make_engine
from floom.store.models import Artifact, Run, RunEvent, new_id

REPEATS = 9
SEED_RUNS = 5
BATCH = 2000
SLACK_MS = 2.0
SETTLE_SECONDS = 60.0
MAX_RATIO = 1.5
RUN_BODY = {"inputs": {"name": "storage"}}


def timed_ms(fn: Any) -> float:
    fn()  # warm-up
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def settle(server: Server) -> None:
    """Wait until the fresh server is idle (its start-up work on a big store done, such as
    the housekeeping's first pass), at most SETTLE_SECONDS."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        cpu0 = proc_cpu_seconds(server.proc.pid)
        time.sleep(0.5)
        if proc_cpu_seconds(server.proc.pid) - cpu0 < 0.05:
            return


def costs(server: Server) -> dict[str, float]:
    c = server.client
    run_id = c.get("/api/v1/runs", params={"limit": 1}).json()["items"][0]["id"]

    def ok(response: Any) -> Any:
        if response.status_code >= 300:
            raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text}")
        return response.json()

    def page() -> None:
        cursor = ok(c.get("/api/v1/runs", params={"limit": 50}))["next_cursor"]
        ok(c.get("/api/v1/runs", params={"limit": 50, "cursor": cursor}))

    def submit() -> None:
        run = ok(c.post("/api/v1/workers/hello/runs", params={"wait": 30}, json=RUN_BODY))
        if run["status"] != "succeeded":
            raise RuntimeError(f"run {run['id']} did not succeed: {run}")

    return {
        "list": timed_ms(lambda: ok(c.get("/api/v1/runs", params={"limit": 50}))),
        "page": timed_ms(page),
        "logs": timed_ms(lambda: ok(c.get(f"/api/v1/runs/{run_id}/logs"))),
        "submit": timed_ms(submit),
    }


def copy_of(row: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A log line's or artifact's row for another run (its own id left to the database)."""
    return {**{k: v for k, v in row.items() if k != "id"}, "run_id": run_id}


def fill(url: str, upto: int) -> int:
    """Copy the stored runs (with their log lines and artifact rows) under new ids until the
    store holds `upto` runs; returns how many it holds."""
    engine = make_engine(url)
    runs_t = Run.__table__  # type: ignore[attr-defined]
    events_t = RunEvent.__table__  # type: ignore[attr-defined]
    artifacts_t = Artifact.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        templates = [dict(r._mapping) for r in conn.execute(select(runs_t))][:SEED_RUNS]
        events = {
            t["id"]: [
                dict(e._mapping)
                for e in conn.execute(select(events_t).where(events_t.c.run_id == t["id"]))
            ]
            for t in templates
        }
        artifacts = {
            t["id"]: [
                dict(a._mapping)
                for a in conn.execute(select(artifacts_t).where(artifacts_t.c.run_id == t["id"]))
            ]
            for t in templates
        }
        have = len(list(conn.execute(select(runs_t.c.id))))
    oldest = min(t["created_at"] for t in templates)
    while have < upto:
        count = min(BATCH, upto - have)
        run_rows, event_rows, artifact_rows = [], [], []
        for n in range(count):
            template = templates[n % len(templates)]
            # Older than the real runs, one second apart: as a stream of earlier runs left them.
            shift = timedelta(seconds=have + n + 1)
            run = {**template, "id": new_id("run")}
            for name in ("created_at", "started_at", "finished_at"):
                if run[name] is not None:
                    run[name] = oldest - shift + (run[name] - template["created_at"])
            run_rows.append(run)
            event_rows += [copy_of(e, run["id"]) for e in events[template["id"]]]
            artifact_rows += [copy_of(a, run["id"]) for a in artifacts[template["id"]]]
        with engine.begin() as conn:
            conn.execute(insert(runs_t), run_rows)
            if event_rows:
                conn.execute(insert(events_t), event_rows)
            if artifact_rows:
                conn.execute(insert(artifacts_t), artifact_rows)
        have += count
    engine.dispose()
    return have


def measure(root: Path, name: str, url: str | None, database: str | None, args: Any) -> bool:
    print(f"{name}:", flush=True)
    server = Server(root / name, url)
    server.wait_ready()
    for _ in range(SEED_RUNS):
        server.client.post("/api/v1/workers/hello/runs", params={"wait": 30}, json=RUN_BODY)
    store_url = url or f"sqlite:///{server.data_dir / 'floom.db'}"
    key = server.key  # the admin key; later servers on this store keep it
    server.stop()
    readings = {}
    sizes = {}
    for target in (args.baseline, args.runs):
        held = fill(store_url, target)
        server = Server(root / name, url)
        server.key = key
        server.client.close()
        server.client = server.new_client()
        server.wait_ready()
        settle(server)
        try:
            sizes[target] = storage_bytes(server, database)
            readings[target] = costs(server)
        finally:
            server.stop()
        shown = ", ".join(f"{k} {v:.1f} ms" for k, v in readings[target].items())
        print(f"  {held:,} runs stored: {shown}", flush=True)
    per_run = (sizes[args.runs] - sizes[args.baseline]) / (args.runs - args.baseline)
    print(f"  storage: {per_run:,.0f} bytes per run (growth over the fill)")
    ok = True
    for call, base in readings[args.baseline].items():
        late = readings[args.runs][call]
        flat = late <= base * MAX_RATIO + SLACK_MS
        ok &= flat
        print(
            f"  {call:7s} {base:6.1f} -> {late:6.1f} ms ({late / base:.2f}x)  "
            f"{'OK' if flat else 'MISS'}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50_000, help="runs stored at the end")
    parser.add_argument("--baseline", type=int, default=1_000, help="runs stored first")
    parser.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="floom-bench-storage-"))
    print(
        f"storage bench: {args.baseline:,} then {args.runs:,} runs, load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ok = True
    pg_name = f"floom_bench_{uuid.uuid4().hex[:8]}"
    try:
        ok &= measure(root, "sqlite", None, None, args)
        if args.postgres:
            url = pg_database(True, pg_name)
            ok &= measure(root, "postgres", url, pg_name, args)
    finally:
        if args.postgres:
            with contextlib.suppress(Exception):
                pg_database(False, pg_name)
        shutil.rmtree(root, ignore_errors=True)
    print(f"flat cost per run at {args.runs:,} runs: {'OK' if ok else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
