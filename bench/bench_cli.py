"""Bench: the CLI's wall time and the idle server's memory (issue 14's CLI and memory targets).

Run from the repository root:

    .venv/bin/python bench/bench_cli.py [--repeats 9] [--before CHECKOUT]

For this checkout (and, with `--before`, another one, e.g. a `git archive` of an older
commit, measured interleaved under the same load) it starts a real `floom serve` on SQLite in
a fresh data dir with the examples deployed, and measures:

- the idle server's RSS (the process and its children) and CPU, `IDLE_SECONDS` after
  /healthz answers;
- `floom --help` wall time, median of `--repeats`;
- `floom run hello -i name=bench --wait --json` wall time, median, each paired with a floor
  run (bubblewrap running hello with floom's own flags, bench/floor.py) and with the same
  request sent from this warm process, which splits the time into the server's share and
  the CLI's own (start-up, imports, one connection);
- `floom run hello -i name=bench --wait` (log lines and result for a person) wall time,
  median, reported against the same floor (no target: it follows the log stream, which the
  server polls every 0.2 s).

With each CLI wall time it prints the CLI process's own CPU time (median), which others' load
moves far less. It prints the figures and the targets with OK/MISS; it asserts only that
every command succeeded. The machine's load average is printed with the figures (absolute
times move with others' load).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

from floor import FloorSlot  # noqa: E402
from server import VENV_BIN, Server, proc_cpu_seconds, tree_rss_mb  # noqa: E402

IDLE_SECONDS = 3.0
CLI_HELP_MS = 150.0
CLI_RUN_OVER_FLOOR_MS = 150.0
IDLE_RSS_MIB = 100.0


def children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def loadavg() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} {five:.2f}"


class Checkout:
    """One checkout's server and CLI environment."""

    def __init__(self, name: str, root: Path, checkout: Path | None) -> None:
        self.name = name
        # This checkout's code, not whichever one the venv's editable install points at.
        extra = {"PYTHONPATH": str(checkout or REPO)}
        self.server = Server(root / name, None, extra)
        self.server.wait_ready()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        self.env.pop("PYTHONPATH", None)
        self.env.update(extra)
        self.env.update(FLOOM_BASE_URL=self.server.base_url, FLOOM_API_KEY=self.server.key)
        # The CLI process's own CPU seconds per command, by its last argument: under others'
        # load they move far less than wall times.
        self.cpu: dict[str, list[float]] = {}

    def idle(self) -> tuple[float, float]:
        pid = self.server.proc.pid
        cpu0 = proc_cpu_seconds(pid)
        time.sleep(IDLE_SECONDS)
        cpu = (proc_cpu_seconds(pid) - cpu0) / IDLE_SECONDS * 100
        return tree_rss_mb(pid)[0], cpu

    def request(self) -> float:
        """The same run as one request from this warm process: the server's share."""
        t0 = time.perf_counter()
        answer = self.server.client.post(
            "/api/v1/workers/hello/runs",
            params={"wait": 30},
            json={"inputs": {"name": "bench"}, "coerce_strings": True},
            timeout=60,
        )
        elapsed = time.perf_counter() - t0
        if answer.status_code != 200 or answer.json()["status"] != "succeeded":
            raise RuntimeError(f"{self.name}: the run request failed: {answer.text[:300]}")
        return elapsed

    def call(self, *args: str) -> float:
        t0 = time.perf_counter()
        cpu0 = children_cpu_seconds()
        done = subprocess.run(
            [str(VENV_BIN / "floom"), *args], env=self.env, capture_output=True, timeout=60
        )
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: floom {' '.join(args)} failed: {done.stderr!r}")
        self.cpu.setdefault(args[-1], []).append(children_cpu_seconds() - cpu0)
        return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="calls of each command")
    parser.add_argument("--before", metavar="CHECKOUT", help="also measure this checkout")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="floom-bench-cli-"))
    print(f"bench_cli: repeats={args.repeats}, cores={os.cpu_count()}, {loadavg()}")
    checkouts: list[Checkout] = []
    try:
        floor = FloorSlot(root / "floor", "lane0")
        wanted: list[tuple[str, Path | None]] = [("this", None)]
        if args.before:
            wanted.append(("before", Path(args.before).resolve()))
        for name, checkout in wanted:
            checkouts.append(Checkout(name, root, checkout))
        idle = {c.name: c.idle() for c in checkouts}
        for c in checkouts:
            print(f"{c.name}: idle RSS {idle[c.name][0]:.1f} MiB, idle CPU {idle[c.name][1]:.1f}%")
        helps: dict[str, list[float]] = {c.name: [] for c in checkouts}
        runs: dict[str, list[float]] = {c.name: [] for c in checkouts}
        shown: dict[str, list[float]] = {c.name: [] for c in checkouts}
        requests: dict[str, list[float]] = {c.name: [] for c in checkouts}
        floors: list[float] = []
        for c in checkouts:  # warm-up: the page cache, the server's first run
            c.call("--help")
            c.call("run", "hello", "-i", "name=bench", "--wait", "--json")
            c.call("run", "hello", "-i", "name=bench", "--wait")
        floor.run_once()
        for _ in range(args.repeats):
            for c in checkouts:
                helps[c.name].append(c.call("--help"))
            floors.append(floor.run_once())
            for c in checkouts:
                runs[c.name].append(c.call("run", "hello", "-i", "name=bench", "--wait", "--json"))
                requests[c.name].append(c.request())
                shown[c.name].append(c.call("run", "hello", "-i", "name=bench", "--wait"))
        floor_ms = statistics.median(floors) * 1000
        print(f"floor (bwrap python3 run.py): {floor_ms:.0f} ms; {loadavg()}")
        for c in checkouts:
            cpu_ms = {k: statistics.median(v) * 1000 for k, v in c.cpu.items()}
            help_ms = statistics.median(helps[c.name]) * 1000
            run_ms = statistics.median(runs[c.name]) * 1000
            over = run_ms - floor_ms
            rss = idle[c.name][0]
            print(f"{c.name}:")
            print(
                f"  floom --help {help_ms:.0f} ms (target <= {CLI_HELP_MS:g}): "
                f"{'OK' if help_ms <= CLI_HELP_MS else 'MISS'}; CPU {cpu_ms['--help']:.0f} ms"
            )
            print(
                f"  floom run hello --wait --json {run_ms:.0f} ms = floor {over:+.0f} ms "
                f"(target <= +{CLI_RUN_OVER_FLOOR_MS:g}): "
                f"{'OK' if over <= CLI_RUN_OVER_FLOOR_MS else 'MISS'}; "
                f"CLI CPU {cpu_ms['--json']:.0f} ms"
            )
            request_ms = statistics.median(requests[c.name]) * 1000
            print(
                f"    of which the server: the same request from a warm client {request_ms:.0f} "
                f"ms (floor {request_ms - floor_ms:+.0f} ms); the CLI {run_ms - request_ms:+.0f} ms"
            )
            shown_ms = statistics.median(shown[c.name]) * 1000
            print(
                f"  floom run hello --wait (log lines) {shown_ms:.0f} ms = floor "
                f"{shown_ms - floor_ms:+.0f} ms; CLI CPU {cpu_ms['--wait']:.0f} ms"
            )
            print(
                f"  idle RSS {rss:.1f} MiB (target <= {IDLE_RSS_MIB:g}): "
                f"{'OK' if rss <= IDLE_RSS_MIB else 'MISS'}"
            )
    finally:
        for c in checkouts:
            c.server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
