"""Benchmark: floom's run path as ratios to the floor, measured side by side in one go.

Run from the repository root:

    .venv/bin/python bench/bench_runs.py [--runs N] [--per-client K] [--burst M] [--postgres]

The floor is bubblewrap running workers/hello's `python3 run.py` with floom's own flags
(bench/floor.py records the command line floom's LocalSandbox builds). Against it, in the same
run and interleaved round by round: floom on SQLite, floom on PostgreSQL (`--postgres`, a fresh
database on 127.0.0.1:5432), and Celery + Redis running the same command (skipped with a note
when celery, redis or the Redis server is missing). Then the CLI's timings, the server's idle
memory and CPU, and storage per run. It prints figures and a table of the issue's targets
with OK/MISS; it asserts nothing, except that every run succeeded with its log complete and
in order. All traffic goes to 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

from server import VENV_BIN, Server, machine_busy_seconds, tree_rss_mb  # noqa: E402
from systems import CeleryStack, Floom, Floor, celery_missing  # noqa: E402

from floom.services.runs.rules import FINISHED  # noqa: E402

EXECUTOR_SLOTS = 4  # floom's default executor_slots; the floor and Celery get the same
IDLE_SECONDS = 3.0
CLI_REPEATS = 9
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# The targets of issue 14 (bench/README.md).
TARGETS = {
    "sqlite": {"latency": 1.15, "throughput": 0.9, "cpu_ms": 8.0},
    "postgres": {"latency": 1.3, "throughput": 0.8, "cpu_ms": 12.0},
}
CLI_HELP_MS = 150.0
CLI_RUN_OVER_FLOOR_MS = 150.0
IDLE_RSS_MIB = 100.0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def say(text: str) -> None:
    print(text, flush=True)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Phase:
    """CPU seconds of each system's own processes across a phase, per run."""

    def __init__(self, systems: list[Any]) -> None:
        self.systems = systems
        self.before = {s.name: s.cpu() for s in systems}

    def per_run_ms(self, runs: int) -> dict[str, float]:
        return {s.name: (s.cpu() - self.before[s.name]) * 1000 / runs for s in self.systems}


def latency(systems: list[Any], runs: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """`runs` rounds; in each, every system runs hello once (the order rotates per round)."""
    found: dict[str, list[float]] = {s.name: [] for s in systems}
    phase = Phase(systems)
    for i in range(runs):
        for s in systems[i % len(systems) :] + systems[: i % len(systems)]:
            found[s.name].append(s.one(0))
    return found, phase.per_run_ms(runs)


def throughput(system: Any, clients: int, per_client: int) -> float:
    """Runs per second of `clients` loops each running hello `per_client` times."""

    def loop(lane: int) -> None:
        for _ in range(per_client):
            system.one(lane)

    def all_loops() -> None:
        with ThreadPoolExecutor(clients) as pool:
            for f in [pool.submit(loop, lane) for lane in range(clients)]:
                f.result()

    return clients * per_client / timed(all_loops)


def check_logs(floom: Floom) -> tuple[int, int]:
    """Runs whose log lacks the script's line or has it after the run's final status event."""
    missing = late = 0
    client = floom.clients[0]
    for run_id in floom.run_ids:
        items = client.get(f"/api/v1/runs/{run_id}/logs", params={"limit": 100}).json()["items"]
        greeting = [e["seq"] for e in items if e["stream"] == "stdout"]
        final = [
            e["seq"]
            for e in items
            if e["stream"] == "system" and e["line"].split(":", 1)[0] in FINISHED
        ]
        seqs = [e["seq"] for e in items]
        if not greeting:
            missing += 1
        elif (final and min(final) < greeting[0]) or seqs != sorted(seqs):
            late += 1
    return missing, late


def storage_bytes(server: Server, database: str | None) -> int:
    """Bytes the server keeps for good: the pages its database uses (SQLite: read-only, free
    pages and the write-ahead log left out; PostgreSQL: pg_database_size) and its data dir
    except the transient run work dirs and the SQLite files."""
    keep = 0
    for root, dirs, files in os.walk(server.data_dir):
        if Path(root) == server.data_dir:
            # The run work dirs, which the server deletes as it goes: not kept, not walked.
            dirs[:] = [d for d in dirs if d != "runs"]
        for name in files:
            if not name.startswith("floom.db"):
                with contextlib.suppress(FileNotFoundError):
                    keep += (Path(root) / name).stat().st_size
    if database:
        import psycopg  # only with --postgres

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            row = conn.execute("SELECT pg_database_size(%s)", (database,)).fetchone()
            return keep + (int(row[0]) if row else 0)
    uri = f"file:{server.data_dir / 'floom.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        pages: int = db.execute("PRAGMA page_count").fetchone()[0]
        free: int = db.execute("PRAGMA freelist_count").fetchone()[0]
        size: int = db.execute("PRAGMA page_size").fetchone()[0]
    return keep + (pages - free) * size


def pg_database(create: bool, name: str) -> str:
    import psycopg  # only with --postgres

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')
        else:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def cli_timings(server: Server, floor: Floor) -> dict[str, float]:
    """Wall seconds (medians) of `floom --help` and of `floom run hello --wait --json`, each
    run paired with a floor run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env.update(FLOOM_BASE_URL=server.base_url, FLOOM_API_KEY=server.key)
    floom_cmd = str(VENV_BIN / "floom")

    def call(*args: str) -> float:
        t0 = time.perf_counter()
        done = subprocess.run([floom_cmd, *args], env=env, capture_output=True, timeout=60)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"floom {' '.join(args)} failed: {done.stderr[-300:]!r}")
        return elapsed

    call("--help")
    helps, runs, floors = [], [], []
    for _ in range(CLI_REPEATS):
        helps.append(call("--help"))
        floors.append(floor.one(0))
        runs.append(call("run", "hello", "-i", "name=bench", "--wait", "--json"))
    return {"help": median(helps), "run": median(runs), "floor": median(floors)}


def idle_readings(server: Server) -> tuple[float, float]:
    """RSS (MiB) and CPU (% of a core) of the idle server."""
    from server import proc_cpu_seconds

    cpu0 = proc_cpu_seconds(server.proc.pid)
    time.sleep(IDLE_SECONDS)
    cpu = (proc_cpu_seconds(server.proc.pid) - cpu0) / IDLE_SECONDS * 100
    return tree_rss_mb(server.proc.pid)[0], cpu


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="latency rounds (default 30)")
    parser.add_argument("--per-client", type=int, default=20, help="runs per client loop")
    parser.add_argument("--burst", type=int, default=200, help="runs queued at once")
    parser.add_argument("--postgres", action="store_true", help="add floom on PostgreSQL")
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery column")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs)")
    parser.add_argument(
        "--before",
        metavar="CHECKOUT",
        help="also run floom on SQLite from this checkout (e.g. a worktree of an older commit), "
        "interleaved with the others: before/after figures under the same load",
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="floom-bench-"))
    started = time.perf_counter()
    one, five, _ = os.getloadavg()
    say(
        f"floom run benchmark: rounds={args.runs}, per client={args.per_client}, "
        f"burst={args.burst}, cores={os.cpu_count()}, kernel {platform.release()}, "
        f"load average {one:.2f} {five:.2f}"
    )
    servers: dict[str, Server] = {}
    systems: list[Any] = []
    pg_name = f"floom_bench_{uuid.uuid4().hex[:8]}"
    pg_url = pg_database(True, pg_name) if args.postgres else None
    try:
        floor = Floor(root / "floor", EXECUTOR_SLOTS)
        say(f"floor command (floom's own, recorded): {floor.command[:160]}...")
        systems.append(floor)
        wanted = [("sqlite", None, None), ("postgres", pg_url, None), ("before", None, args.before)]
        for name, url, checkout in wanted:
            if (name == "postgres" and url is None) or (name == "before" and not checkout):
                continue
            extra = {"PYTHONPATH": str(Path(checkout).resolve())} if checkout else None
            server = Server(root / name, url, extra)
            server.wait_ready()
            servers[name] = server
        idle = {name: idle_readings(s) for name, s in servers.items()}
        for name, server in servers.items():
            systems.append(Floom(name, server))
        why_not_celery = "skipped (--no-celery)" if args.no_celery else celery_missing()
        if why_not_celery is None:
            systems.append(CeleryStack(root, EXECUTOR_SLOTS))
        else:
            say(f"celery column: {why_not_celery}")
        for s in systems:  # warm-up, not counted
            for _ in range(3):
                s.one(0)

        say(f"latency: {args.runs} interleaved rounds ...")
        lat, lat_cpu = latency(systems, args.runs)
        rates: dict[str, dict[str, float]] = {s.name: {} for s in systems}
        cpu_load: dict[str, float] = {}
        machine: dict[str, float] = {}
        for clients in (2, 4):
            say(f"throughput: {clients} clients x {args.per_client} runs ...")
            for s in systems:
                rates[s.name][str(clients)] = throughput(s, clients, args.per_client)
        stored: dict[str, float] = {}
        say(f"burst of {args.burst} ...")
        for s in systems:
            its_server = servers.get(s.name)
            size0 = (
                storage_bytes(its_server, pg_name if s.name == "postgres" else None)
                if its_server
                else 0
            )
            phase = Phase([s])
            busy = machine_busy_seconds()
            rates[s.name]["burst"] = args.burst / timed(partial(s.burst, args.burst))
            cpu_load[s.name] = phase.per_run_ms(args.burst)[s.name]
            machine[s.name] = (machine_busy_seconds() - busy) * 1000 / args.burst
            if its_server:
                size1 = storage_bytes(its_server, pg_name if s.name == "postgres" else None)
                stored[s.name] = (size1 - size0) / args.burst
        cli = cli_timings(servers["sqlite"], floor)
        logs = {s.name: check_logs(s) for s in systems if isinstance(s, Floom)}
        costs = {"seq": lat_cpu, "load": cpu_load, "machine": machine}
        report(args, floor, systems, lat, costs, rates, stored, cli, idle, logs)
    finally:
        for s in systems:
            if hasattr(s, "close"):
                s.close()
        for server in servers.values():
            server.stop()
        if pg_url:
            pg_database(False, pg_name)
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say(f"bench took {time.perf_counter() - started:.0f} s")
    return 0


def report(
    args: argparse.Namespace,
    floor: Floor,
    systems: list[Any],
    lat: dict[str, list[float]],
    costs: dict[str, dict[str, float]],
    rates: dict[str, dict[str, float]],
    stored: dict[str, float],
    cli: dict[str, float],
    idle: dict[str, tuple[float, float]],
    logs: dict[str, tuple[int, int]],
) -> None:
    base = median(lat["floor"])
    lat_cpu, cpu_load, machine = costs["seq"], costs["load"], costs["machine"]
    say("")
    say(
        f"floor: latency p50 {base * 1000:.1f} ms; throughput "
        + " / ".join(f"{rates['floor'][k]:.1f}" for k in ("2", "4", "burst"))
        + f" runs/s (2 / 4 clients, burst); machine {machine['floor']:.1f} ms/run in the burst"
    )
    header = (
        "",
        "latency p50",
        "throughput vs floor (2 / 4 / burst)",
        "CPU/run seq, load",
        "machine/run (burst)",
    )
    rows = [header]
    for s in systems[1:]:
        r = rates[s.name]
        ratio = " / ".join(f"{r[k] / rates['floor'][k]:.2f}" for k in ("2", "4", "burst"))
        p50 = median(lat[s.name])
        rows.append(
            (
                s.name if s.name == "celery" else f"floom {s.name}",
                f"{p50 / base:.2f}x ({(p50 - base) * 1000:+.1f} ms)",
                ratio,
                f"{lat_cpu[s.name]:.1f} ms, {cpu_load[s.name]:.1f} ms",
                f"{machine[s.name]:.1f} ms ({machine[s.name] - machine['floor']:+.1f})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    say("(CPU/run: the system's own processes, sandboxes excluded; seq = latency phase, load =")
    say(" burst; floom = the server process, celery = its worker and children, not Redis.")
    say(" machine/run: the whole machine's busy CPU over the burst per run, sandboxes, clients,")
    say(" Redis and PostgreSQL included, and the difference to the floor's: what a CPU-bound")
    say(" node pays for a run, so throughput vs floor is about floor's / system's.)")

    say("")
    checks: list[tuple[str, str, str]] = []
    celery = "celery" if "celery" in rates else None
    for name, target in TARGETS.items():
        if name not in rates:
            checks.append((f"floom {name}", "not measured", "-"))
            continue
        p50 = median(lat[name]) / base
        worst = min(rates[name][k] / rates["floor"][k] for k in ("2", "4", "burst"))
        checks.append(
            (
                f"{name} latency p50 <= {target['latency']}x",
                f"{p50:.2f}x",
                verdict(p50 <= target["latency"]),
            )
        )
        checks.append(
            (
                f"{name} throughput >= {target['throughput']}x (worst of 2/4/burst)",
                f"{worst:.2f}x",
                verdict(worst >= target["throughput"]),
            )
        )
        cpu = max(lat_cpu[name], cpu_load[name])
        checks.append(
            (
                f"{name} server CPU <= {target['cpu_ms']:g} ms/run",
                f"{cpu:.1f} ms",
                verdict(cpu <= target["cpu_ms"]),
            )
        )
        if celery:
            ahead_lat = median(lat[name]) < median(lat[celery])
            ahead_thr = all(rates[name][k] > rates[celery][k] for k in ("2", "4", "burst"))
            checks.append((f"{name} ahead of celery on latency", "", verdict(ahead_lat)))
            checks.append((f"{name} ahead of celery on throughput (all 3)", "", verdict(ahead_thr)))
        rss, cpu_idle = idle[name]
        checks.append(
            (
                f"{name} idle RSS <= {IDLE_RSS_MIB:g} MiB",
                f"{rss:.1f} MiB (idle CPU {cpu_idle:.1f}%)",
                verdict(rss <= IDLE_RSS_MIB),
            )
        )
        missing, late = logs[name]
        runs = len(next(s for s in systems if s.name == name).run_ids)
        checks.append(
            (
                f"{name} every run succeeded, logs complete and ordered",
                f"{runs - missing - late}/{runs}",
                verdict(missing == late == 0),
            )
        )
        checks.append((f"{name} storage per run (burst)", f"{stored[name]:.0f} bytes", "report"))
    if "before" in rates:
        rss, cpu_idle = idle["before"]
        missing, late = logs["before"]
        checks.append(
            (
                "before (the --before checkout): idle RSS, storage per run, logs",
                f"{rss:.1f} MiB (idle CPU {cpu_idle:.1f}%), {stored['before']:.0f} bytes, "
                f"{missing} missing / {late} out of order",
                "report",
            )
        )
    if not celery:
        checks.append(("ahead of celery", "celery column skipped", "-"))
    checks.append(
        (
            f"`floom --help` <= {CLI_HELP_MS:g} ms",
            f"{cli['help'] * 1000:.0f} ms",
            verdict(cli["help"] * 1000 <= CLI_HELP_MS),
        )
    )
    over = (cli["run"] - cli["floor"]) * 1000
    checks.append(
        (
            f"`floom run hello --wait --json` <= floor + {CLI_RUN_OVER_FLOOR_MS:g} ms",
            f"{cli['run'] * 1000:.0f} ms = floor {cli['floor'] * 1000:.0f} ms {over:+.0f} ms",
            verdict(over <= CLI_RUN_OVER_FLOOR_MS),
        )
    )
    widths = [max(len(c[i]) for c in checks) for i in range(3)]
    for c in checks:
        say("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)))
    one, five, _ = os.getloadavg()
    if one > (os.cpu_count() or 1) / 2:
        say(f"\nWARNING: load average {one:.2f} {five:.2f}: others share this machine; the ratios")
        say("are measured interleaved and are what to trust, not the absolute figures.")


if __name__ == "__main__":
    sys.exit(main())
