"""Soak: does the server's memory stay flat over many runs, and does storage per run stay flat?

Run from the repository root:

    .venv/bin/python bench/bench_soak.py [--runs 20000] [--baseline 1000] [--clients 8]

This process holds only a real floom server (API, executor, local sandbox, SQLite in a fresh
data dir) served by uvicorn on a loopback port, with tracemalloc tracing (one frame: top
growth by line). The clients that run workers/hello through it (each run one
`POST /workers/hello/runs?wait=30`) are a separate process (bench/soak_client.py), so their
CPU, allocations and GIL are not the server's. It reads this process's RSS and a
tracemalloc snapshot after `--baseline` runs and again at the end, and the RSS every 1,000
runs between. The two RSS readings that the target compares are taken right after handing the
C heap's free pages back to the system, which the server does itself every
presence.RELEASE_SECONDS (engine/loops/heap.py), so that they do not depend on when its last release
was; the readings before that release are printed too. Target (issue 14): RSS at the end
within 5 MiB of RSS after the baseline, less what tracemalloc's own table of traces grew in
between (tracemalloc.get_tracemalloc_memory: a server without tracemalloc holds none of it;
both figures are printed); on a miss it prints tracemalloc's top growth. With
each RSS it prints what the SQLite library holds (its connections' page caches) and the C
heap's memory in use and free (glibc's mallinfo2). It also prints the store's bytes per
run and how long listing, paging, reading logs and submitting take at the start and at the
end (flat cost per run). Every run must succeed; failed runs are counted and printed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import IO, Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))  # this checkout's floom, wherever it is run from

import uvicorn  # noqa: E402

from floom.api.app import create_app  # noqa: E402
from floom.config import Settings  # noqa: E402
from floom.engine.loops.heap import release_free_memory  # noqa: E402
from floom.services.access import keys  # noqa: E402
from floom.services.access.principal import SYSTEM  # noqa: E402
from floom.services.context import Context  # noqa: E402

GROWTH_LIMIT_MIB = 5.0
SQLITE_STATUS_MEMORY_USED = 0
TOP = 15


def free_port() -> int:
    # Not bench/server.py's: it imports httpx, which an idle floom server does not load.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("soak: no VmRSS in /proc/self/status")


def traced_mib() -> float:
    return tracemalloc.get_traced_memory()[0] / 2**20


def tracing_mib() -> float:
    """What tracemalloc itself holds outside the traced heap: its table of traces, about 30
    bytes per live block, which doubles its buckets at once as the blocks grow (a step of
    MiBs that a server without tracemalloc does not take)."""
    return tracemalloc.get_tracemalloc_memory() / 2**20


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


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def c_heap() -> str:
    """The C heap (glibc's mallinfo2, all arenas): memory in use and memory free in it (free
    chunks stay resident until released, engine/loops/heap.py); "?" where it cannot be read."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return "?"
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return f"{info.uordblks / 2**20:.1f} MiB in use, {info.fordblks / 2**20:.1f} MiB free"


def released_rss() -> tuple[float, float]:
    """RSS before and after handing the C heap's free pages back to the system, as the
    server does every presence.RELEASE_SECONDS: readings after a release do not depend on
    how long ago the server's last one was."""
    before = rss_mib()
    release_free_memory()
    return before, rss_mib()


def memory(ctx: Context) -> str:
    """Where the RSS is (anonymous or file-backed), the store's pooled connections, what
    SQLite holds (each SQLite connection keeps its own page cache) and the C heap."""
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    pool = ctx.engine.pool
    kept = pool.checkedin() if hasattr(pool, "checkedin") else "?"
    return (
        f"RssAnon {fields.get('RssAnon', '?').strip()}, RssFile "
        f"{fields.get('RssFile', '?').strip()}; pooled connections idle: {kept}; "
        f"SQLite heap {sqlite_heap()}; C heap {c_heap()}"
    )


def store_bytes(data_dir: Path) -> int:
    uri = f"file:{data_dir / 'floom.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


class Clients:
    """The client process (bench/soak_client.py), driven over its stdin and stdout."""

    def __init__(self, url: str, token: str, clients: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH / "soak_client.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.stdin: IO[str] = self.proc.stdin  # type: ignore[assignment]
        self.stdout: IO[str] = self.proc.stdout  # type: ignore[assignment]
        self.send({"url": url, "token": token, "clients": clients})

    def send(self, message: dict[str, Any]) -> None:
        self.stdin.write(json.dumps(message) + "\n")
        self.stdin.flush()

    def answer(self) -> dict[str, Any]:
        line = self.stdout.readline()
        if not line:
            raise SystemExit(f"soak: the client process ended ({self.proc.wait()})")
        return dict(json.loads(line))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--baseline", type=int, default=1000)
    parser.add_argument(
        "--clients",
        type=int,
        default=8,
        help="client threads, each waiting for its run (the executor has 4 slots; one API key "
        "may wait for at most FLOOM_MAX_WAITS_PER_KEY runs at once, 8 by default)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=0,
        help="end the runs after --baseline at this many minutes from the start, even short "
        "of --runs, and report what was reached (0: no limit)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args(argv)
    if args.runs <= args.baseline:
        parser.error("--runs must be more than --baseline")
    stop_at = time.time() + args.max_minutes * 60 if args.max_minutes else 0
    tracemalloc.start(1)
    data_dir = Path(tempfile.mkdtemp(prefix="floom-soak-"))
    # No request rate limit: one key makes every run's requests, and at 13 runs/s and more
    # they pass the default 1,200 a minute (429s would count as failed runs).
    settings = Settings(
        data_dir=data_dir,
        deploy_examples=True,
        secret_key="soak-secret-key",
        rate_limit_per_minute=0,
    )
    if args.clients > settings.max_waits_per_key:
        shutil.rmtree(data_dir, ignore_errors=True)
        parser.error(f"--clients: one API key may wait for {settings.max_waits_per_key} at most")
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
    clients = Clients(f"http://127.0.0.1:{port}", token, args.clients)
    done = [0]
    failures = [0]
    failed: list[str] = []
    last_id = [""]
    t0 = time.perf_counter()

    def phase(count: int, until: float = 0) -> float:
        """Runs `count` runs through the clients, printing RSS every 1,000; their rate."""
        cpu0, client_cpu0 = os.times(), clients.cpu_seconds()
        clients.send({"cmd": "runs", "count": count, "stop_at": until})
        while "progress" in (msg := clients.answer()):
            print(
                f"  {done[0] + msg['progress']} runs ({time.perf_counter() - t0:.0f} s, "
                f"{msg['progress'] / msg['seconds']:.1f} runs/s, {load()}): RSS "
                f"{rss_mib():.1f} MiB, traced {traced_mib():.1f} MiB (tracemalloc's own "
                f"{tracing_mib():.1f} MiB), C heap {c_heap()}, "
                f"failed {failures[0] + msg['failures']}",
                flush=True,
            )
        done[0] += msg["done"]
        failures[0] += msg["failures"]
        failed.extend(msg["failed"])
        last_id[0] = msg["last_id"] or last_id[0]
        cpu1 = os.times()
        server_cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
        sandbox_cpu = (
            cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system
        )
        client_cpu = clients.cpu_seconds() - client_cpu0
        runs = max(1, msg["done"])
        print(
            f"  CPU per run: server process {server_cpu / runs * 1000:.1f} ms, its children "
            f"(the sandboxes) {sandbox_cpu / runs * 1000:.1f} ms, the clients' process "
            f"{client_cpu / runs * 1000:.1f} ms",
            flush=True,
        )
        return float(msg["done"] / max(msg["seconds"], 1e-9))

    def probe_costs() -> dict[str, float]:
        clients.send({"cmd": "probe", "run_id": last_id[0]})
        return {k: float(v) for k, v in clients.answer().items()}

    try:
        base_rate = phase(args.baseline)
        # The baseline snapshot (MiB of traces) is held until the end, so it is taken
        # before the baseline reading: both RSS readings include it.
        base_snap = tracemalloc.take_snapshot()
        gc.collect()
        base_unreleased, base_rss = released_rss()
        base_traced, base_tracing = traced_mib(), tracing_mib()
        base_bytes, base_runs = store_bytes(data_dir), done[0]
        base_costs = probe_costs()
        elapsed = time.perf_counter() - t0
        print(
            f"after {done[0]} runs ({elapsed:.0f} s, {base_rate:.1f} runs/s, {load()}): "
            f"RSS {base_rss:.1f} MiB ({base_unreleased:.1f} before the release), traced "
            f"{base_traced:.1f} MiB, tracemalloc's own {base_tracing:.1f} MiB",
            flush=True,
        )
        print(f"  {memory(ctx)}", flush=True)
        rate = phase(args.runs - args.baseline, stop_at)
        gc.collect()
        end_unreleased, end_rss = released_rss()
        end_traced, end_tracing = traced_mib(), tracing_mib()
        end_snap = tracemalloc.take_snapshot()
        end_bytes = store_bytes(data_dir)
        end_costs = probe_costs()
        per_run = (end_bytes - base_bytes) / max(1, done[0] - base_runs)
        elapsed = time.perf_counter() - t0
        print(
            f"after {done[0]} runs ({elapsed:.0f} s, {rate:.1f} runs/s since the baseline, "
            f"{load()}): RSS {end_rss:.1f} MiB ({end_unreleased:.1f} before the release), "
            f"traced {end_traced:.1f} MiB, tracemalloc's own {end_tracing:.1f} MiB"
        )
        if done[0] < args.runs:
            print(f"  stopped short of {args.runs} runs by --max-minutes {args.max_minutes:g}")
        print(f"  {memory(ctx)}")
        print(f"failed runs: {failures[0]}" + (f" (first: {failed[0]})" if failed else ""))
        print(f"store: {per_run:.0f} bytes per run (database pages in use)")
        for name in base_costs:
            print(f"  {name}: {base_costs[name]:.1f} ms -> {end_costs[name]:.1f} ms")
        # The target is the server's: the RSS growth less what tracemalloc's own table grew.
        growth = end_rss - base_rss
        own = end_tracing - base_tracing
        ok = growth - own <= GROWTH_LIMIT_MIB
        verdict = "OK" if ok else "MISS"
        print(
            f"RSS growth {growth:+.1f} MiB, of which tracemalloc's own table {own:+.1f} MiB: "
            f"the server {growth - own:+.1f} MiB, target <= {GROWTH_LIMIT_MIB:g}: {verdict} "
            f"(before the releases: {end_unreleased - base_unreleased:+.1f} MiB)"
        )
        # Python's own heap, which RSS can hide (freed memory is reused before RSS grows).
        traced = end_traced - base_traced
        print(f"traced Python memory growth {traced:+.1f} MiB")
        if not ok or traced > GROWTH_LIMIT_MIB:
            print(f"tracemalloc top {TOP} growth since the baseline:")
            for stat in end_snap.compare_to(base_snap, "lineno")[:TOP]:
                print(f"  {stat}")
    finally:
        clients.close()
        server.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 1 if failures[0] else 0


if __name__ == "__main__":
    sys.exit(main())
