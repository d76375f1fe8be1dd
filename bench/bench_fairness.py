"""Benchmark: an admin's requests while others abuse the node (issue 28, item 10).

Run from the repository root:

    .venv/bin/python bench/bench_fairness.py [--before CHECKOUT] [--streams 600] [--floods 3]

For this checkout (and, with `--before`, another one, e.g. a `git archive` of an older
commit, in the same run) it starts a real `floom serve` on SQLite with a fresh data dir and
measures the latency of an admin's requests (`GET /workers` and `GET /runs?limit=20` in
turn, one at a time) in three phases:

- idle: nothing else happens;
- streams: one read key asks for S log streams of one running run at once (raw sockets that
  send the request and read only the status line, then keep the connection open), as an
  abusive client would; the counts of streams accepted and refused are printed;
- floods: F runs each write log lines as fast as they can (100-byte lines, for as long as
  the phase lasts); the lines each run stored are printed.

It prints p50 and p99 of each phase and their ratios to the same server's idle figures, all
measured in this one run; it asserts nothing.
"""

from __future__ import annotations

import argparse
import select
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

from server import Server  # noqa: E402

from floom.bundle import read_folder  # noqa: E402

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
FLOOD = """\
import sys
chunk = ("flood " + "x" * 93 + "\\n") * 1000
while True:
    sys.stdout.write(chunk)
"""
STATUS_DEADLINE_SECONDS = 30.0


def deploy(http: httpx.Client, root: Path, name: str, script: str) -> None:
    folder = root / "workers" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.yml").write_text(f"name: {name}\nlimits: {{timeout_seconds: 600}}\n")
    (folder / "run.py").write_text(script)
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    resp = http.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    resp.raise_for_status()


def start(http: httpx.Client, worker: str) -> str:
    resp = http.post(f"/api/v1/workers/{worker}/runs", json={})
    resp.raise_for_status()
    run_id: str = resp.json()["id"]
    return run_id


def wait_running(http: httpx.Client, run_ids: list[str]) -> None:
    deadline = time.monotonic() + STATUS_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        statuses = {http.get(f"/api/v1/runs/{r}").json()["status"] for r in run_ids}
        if statuses == {"running"}:
            return
        time.sleep(0.1)
    raise RuntimeError(f"runs not running within {STATUS_DEADLINE_SECONDS:g} s")


def cancel(http: httpx.Client, run_ids: list[str]) -> None:
    for run_id in run_ids:
        http.post(f"/api/v1/runs/{run_id}/cancel")
    for run_id in run_ids:
        http.get(f"/api/v1/runs/{run_id}", params={"wait": 30})


def admin_latencies(http: httpx.Client, count: int) -> list[float]:
    """Milliseconds of `count` admin requests, one at a time."""
    took = []
    for i in range(count):
        path = "/api/v1/workers" if i % 2 else "/api/v1/runs?limit=20"
        began = time.perf_counter()
        resp = http.get(path)
        took.append((time.perf_counter() - began) * 1000)
        resp.raise_for_status()
    return took


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def open_streams(
    server: Server, token: str, run_id: str, count: int
) -> tuple[list[socket.socket], int, int]:
    """`count` log streams of `run_id` asked for at once; the sockets (kept open) and how
    many were answered 200 and 429."""
    request = (
        f"GET /api/v1/runs/{run_id}/logs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(request)
        socks.append(s)
    accepted = refused = 0
    waiting = {s.fileno(): s for s in socks}
    deadline = time.monotonic() + STATUS_DEADLINE_SECONDS
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(list(waiting), [], [], 1.0)
        for fd in ready:
            head = waiting.pop(fd).recv(64)
            if b" 200 " in head:
                accepted += 1
            elif b" 429 " in head:
                refused += 1
    return socks, accepted, refused


def measure(
    name: str, root: Path, checkout: Path | None, args: argparse.Namespace
) -> dict[str, str]:
    extra = {"PYTHONPATH": str((checkout or REPO).resolve())}
    server = Server(root / name, None, extra)
    try:
        server.wait_ready()
        http = server.client
        token = http.post("/api/v1/keys", json={"scopes": ["read"], "name": "abuser"}).json()["key"]
        deploy(http, root / name, "sleeper", SLEEPER)
        deploy(http, root / name, "flood", FLOOD)
        admin_latencies(http, 20)  # warm
        idle = admin_latencies(http, args.requests)

        sleeper = start(http, "sleeper")
        wait_running(http, [sleeper])
        socks, accepted, refused = open_streams(server, token, sleeper, args.streams)
        time.sleep(args.settle)  # the streams' poll loops at their steady state
        streams = admin_latencies(http, args.requests)
        for s in socks:
            s.close()
        cancel(http, [sleeper])

        floods = [start(http, "flood") for _ in range(args.floods)]
        wait_running(http, floods)
        time.sleep(args.settle)
        flooded = admin_latencies(http, args.requests)
        cancel(http, floods)
        stored = [
            http.get(f"/api/v1/runs/{r}/logs", params={"tail": 1}).json()["last_seq"]
            for r in floods
        ]
    finally:
        server.stop()

    def cell(values: list[float]) -> str:
        p50, p99 = p(values, 50), p(values, 99)
        return f"{p50:7.1f} / {p99:7.1f} ms ({p50 / p(idle, 50):4.1f}x / {p99 / p(idle, 99):4.1f}x)"

    return {
        "idle": f"{p(idle, 50):7.1f} / {p(idle, 99):7.1f} ms",
        "streams": cell(streams),
        "floods": cell(flooded),
        "note": f"streams {accepted} accepted, {refused} refused; log events stored per "
        f"flood run {', '.join(str(s) for s in stored)}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout, measured in the same run")
    parser.add_argument("--streams", type=int, default=600)
    parser.add_argument("--floods", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="admin requests per phase")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before measuring")
    args = parser.parse_args()
    systems = [("this", None)] + ([("before", args.before)] if args.before else [])
    with tempfile.TemporaryDirectory(prefix="floom-bench-fairness-") as tmp:
        results = {name: measure(name, Path(tmp), checkout, args) for name, checkout in systems}
    print(
        f"admin request p50 / p99 (ratio to idle); {args.streams} streams from one read key, "
        f"{args.floods} log-flooding runs"
    )
    print(f"{'':8}{'idle':<22}{'streams':<44}{'floods'}")
    for name, row in results.items():
        print(f"{name:8}{row['idle']:<22}{row['streams']:<44}{row['floods']}")
    for name, row in results.items():
        print(f"{name}: {row['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
