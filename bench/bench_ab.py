"""A/B: this checkout's `floom serve` against another checkout's, in alternating blocks.

Run from the repository root:

    .venv/bin/python bench/bench_ab.py --before CHECKOUT [--runs 160] [--blocks 4] [--bursts 3]
    .venv/bin/python bench/bench_ab.py --before CHECKOUT --warm   # hello with `warm: true`

Both servers run workers/hello on SQLite, with fresh data dirs, and are alive throughout. The
sequential runs (one client, each run waited for in the same request) go in `--blocks`
alternating blocks, so each server's runs follow its own: a block of the other checkout never
sits between two of them. Then `--bursts` alternating bursts of `--burst` runs queued at once.
Printed per checkout: latency p50 of the sequential runs, the server's CPU per run in both
phases, the bursts' runs per second, and the whole machine's busy CPU per run in the bursts
(sandboxes and clients included: what a CPU-bound node pays for a run).

Use it where bench_runs.py's interleaving misleads. Moving a process into a cgroup leaves
the kernel's lock ready for about one RCU grace period, so, interleaved round by round, the
moves of one server make the next server's moves cheap: a checkout that moves a process into
a cgroup on each run's path measured 1.31x the floor beside the launchers' checkout and
1.24-1.32x alone (bench/README.md). In blocks, each server's runs mostly follow its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_warm import FloomRunner, await_pool, deploy
from floor import HELLO
from server import Server, machine_busy_seconds, proc_cpu_seconds
from systems import Floom

WARM_UP_RUNS = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--before", required=True, help="the other checkout (e.g. git archive)")
    parser.add_argument("--runs", type=int, default=160, help="sequential runs per checkout")
    parser.add_argument("--blocks", type=int, default=4, help="blocks the runs are split in")
    parser.add_argument("--bursts", type=int, default=3, help="bursts per checkout")
    parser.add_argument("--burst", type=int, default=80, help="runs queued at once per burst")
    parser.add_argument(
        "--warm", action="store_true", help="run hello with `warm: true` (as root; issue 29)"
    )
    args = parser.parse_args()
    if args.runs < args.blocks or args.blocks < 1 or args.bursts < 0 or args.burst < 1:
        parser.error("give at least one run per block, one block, and bursts of one run or more")
    before = Path(args.before).resolve()
    if not (before / "floom").is_dir():
        parser.error(f"{before} holds no floom package")

    root = Path(tempfile.mkdtemp(prefix="floom-ab-"))
    checkouts = {"this": None, "before": str(before)}
    systems: dict[str, Floom] = {}
    try:
        for name, path in checkouts.items():
            env = {"FLOOM_RATE_LIMIT_PER_MINUTE": "0"}
            server = Server(root / name, None, {**env, "PYTHONPATH": path} if path else env)
            server.wait_ready()
            if args.warm:
                deploy(server, HELLO, "hello-warm", warm=True, root=root / name)
                systems[name] = Floom(name, server, worker="hello-warm")
                await_pool(server, FloomRunner(name, server, "hello-warm"))
            else:
                systems[name] = Floom(name, server)
        for system in systems.values():
            for _ in range(WARM_UP_RUNS):
                system.one(0)
        latencies: dict[str, list[float]] = {name: [] for name in systems}
        cpu = dict.fromkeys(systems, 0.0)
        per_block = args.runs // args.blocks
        for _ in range(args.blocks):
            for name, system in systems.items():
                before_cpu = proc_cpu_seconds(system.server.proc.pid)
                latencies[name] += [system.one(0) for _ in range(per_block)]
                cpu[name] += proc_cpu_seconds(system.server.proc.pid) - before_cpu
        burst_cpu = dict.fromkeys(systems, 0.0)
        burst_seconds = dict.fromkeys(systems, 0.0)
        burst_machine = dict.fromkeys(systems, 0.0)
        for _ in range(args.bursts):
            for name, system in systems.items():
                before_cpu = proc_cpu_seconds(system.server.proc.pid)
                before_machine = machine_busy_seconds()
                started = time.perf_counter()
                system.burst(args.burst)
                burst_seconds[name] += time.perf_counter() - started
                burst_machine[name] += machine_busy_seconds() - before_machine
                burst_cpu[name] += proc_cpu_seconds(system.server.proc.pid) - before_cpu
        runs = per_block * args.blocks
        burst_runs = args.burst * args.bursts
        print(f"{runs} sequential runs in {args.blocks} blocks; {args.bursts} x {args.burst} burst")
        print("checkout  latency p50  CPU/run seq  CPU/run burst  burst runs/s  machine/run burst")
        for name in systems:
            p50 = statistics.median(latencies[name]) * 1000
            seq = cpu[name] * 1000 / runs
            burst = burst_cpu[name] * 1000 / burst_runs if burst_runs else 0.0
            rate = burst_runs / burst_seconds[name] if burst_runs else 0.0
            machine = burst_machine[name] * 1000 / burst_runs if burst_runs else 0.0
            print(
                f"{name:8s}  {p50:8.1f} ms  {seq:8.2f} ms  {burst:10.2f} ms  {rate:12.1f}"
                f"  {machine:14.2f} ms"
            )
    finally:
        for system in systems.values():
            system.server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
