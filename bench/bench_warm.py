"""Benchmark: warm starts (worker.yml `warm: true`) against the cold floor, side by side.

Run from the repository root (as root: warm starts need a root floom):

    .venv/bin/python bench/bench_warm.py [--runs N] [--per-client K] [--burst M]

Two workers, each as the bare-bubblewrap floor (bench/floor.py: floom's own sandbox command
line, replayed), as floom's cold run and as floom's warm run, on one `floom serve` on
SQLite: workers/hello, and bench/heavy (hello after importing crypto, YAML, JWT, HTTP, XML,
asyncio and the like, which the sandbox's own Python has). Latency is measured in
interleaved rounds; throughput with 4 clients and in a burst, in rounds whose order of
systems turns (`--rate-rounds`, each round's ratio printed); CPU a run over sequential
runs of one system alone, counted for the bench's own process tree (a cpuacct cgroup of its
own: client, server, warm processes and sandboxes, not other sessions' load; the floor has
no server). It prints figures as ratios to the floor measured in
the same run, and the targets of issue 29 with OK/MISS; it asserts nothing, except that
every run succeeded with its log complete and in order.

`--only` runs some parts alone: `cold` (the hello floor and hello cold: the cold guard),
`warm` (the hello floor and hello warm), `heavy` (heavy's floor, cold and warm), and of the
phases `latency`, `cpu`, `clients` (4 clients) and `burst`; what it names of neither kind
means all of that kind. `--only cold` checks the cold guard alone. Each CPU phase and
throughput phase also prints the server process's own CPU a run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO)]

from floor import HELLO, FloorSlot  # noqa: E402
from server import Server, machine_busy_seconds, proc_cpu_seconds  # noqa: E402

from floom.bundle import read_folder  # noqa: E402
from floom.services.runs.rules import FINISHED, SUCCEEDED  # noqa: E402

HEAVY = BENCH / "heavy"
SAMPLER = BENCH / "sampler"  # its sitecustomize samples the server's threads (--sample)
CLIENTS = 4
READY_SECONDS = 60.0
RUN_DEADLINE_SECONDS = 60.0
WAIT_SECONDS = 30.0
SAMPLE_WRITE_SECONDS = 5.0
# Issue 29's targets, as ratios to the cold floor of the same worker.
HELLO_LATENCY = 0.45
HELLO_THROUGHPUT = 1.5
HEAVY_LATENCY = 0.15
HEAVY_CPU = 0.2
# The cold path's guards (issue 29, from issue 14), on SQLite.
COLD_LATENCY = 1.35
COLD_THROUGHPUT = 0.7
PARTS = ("cold", "warm", "heavy")
PHASES = ("latency", "cpu", "clients", "burst")
# Which systems each part runs (its floor first).
PART_SYSTEMS = {
    "cold": ("floor hello", "hello cold"),
    "warm": ("floor hello", "hello warm"),
    "heavy": ("floor heavy", "heavy cold", "heavy warm"),
}
ALL_SYSTEMS = ("floor hello", "hello cold", "hello warm", "floor heavy", "heavy cold", "heavy warm")
# Throughput is measured for hello only, as in issue 29's targets.
THROUGHPUT_SYSTEMS = ("floor hello", "hello cold", "hello warm")


def say(text: str) -> None:
    print(text, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class FloorRunner:
    """The bare-bubblewrap floor of one worker, one private work dir per client."""

    def __init__(self, name: str, root: Path, worker: Path) -> None:
        self.name = name
        self.lanes = [FloorSlot(root, f"{name}-{i}", worker=worker) for i in range(CLIENTS)]

    def one(self, lane: int) -> float:
        return self.lanes[lane].run_once()

    def burst(self, total: int) -> None:
        left = [total]

        def drain(slot: FloorSlot) -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                slot.run_once()

        import threading

        lock = threading.Lock()
        with ThreadPoolExecutor(CLIENTS) as pool:
            for f in [pool.submit(drain, s) for s in self.lanes]:
                f.result()


class FloomRunner:
    """Runs of one worker of the server: `POST /workers/{name}/runs?wait=`."""

    def __init__(self, name: str, server: Server, worker: str) -> None:
        self.name = name
        self.worker = worker
        self.server = server
        self.clients = [server.new_client() for _ in range(CLIENTS)]
        self.run_ids: list[str] = []

    def _start(self, lane: int, wait: float) -> dict[str, Any]:
        resp = self.clients[lane].post(
            f"/api/v1/workers/{self.worker}/runs",
            params={"wait": f"{wait:g}"} if wait else None,
            json={"inputs": {"name": "bench"}},
            timeout=wait + 30,
        )
        if resp.status_code not in (200, 202):
            raise RuntimeError(f"POST runs answered {resp.status_code}: {resp.text[:300]}")
        body: dict[str, Any] = resp.json()
        self.run_ids.append(body["id"])
        return body

    def _until_end(self, lane: int, run: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + RUN_DEADLINE_SECONDS
        while run.get("status") not in FINISHED:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run['id']} not finished in time")
            run = (
                self.clients[lane]
                .get(f"/api/v1/runs/{run['id']}", params={"wait": f"{WAIT_SECONDS:g}"})
                .json()
            )
        if run["status"] != SUCCEEDED or run["outputs"]["greeting"] != "Hello, bench!":
            raise RuntimeError(f"run {run['id']} did not succeed: {run}")
        return run

    def one(self, lane: int) -> float:
        t0 = time.perf_counter()
        self._until_end(lane, self._start(lane, WAIT_SECONDS))
        return time.perf_counter() - t0

    def burst(self, total: int) -> None:
        with ThreadPoolExecutor(CLIENTS) as pool:
            runs = list(pool.map(lambda i: self._start(i % CLIENTS, 0), range(total)))
        for run in runs:
            self._until_end(0, run)

    def bad_logs(self) -> int:
        """Runs whose log lacks the greeting or holds it after the run's final status."""
        bad = 0
        for run_id in self.run_ids:
            items = (
                self.clients[0]
                .get(f"/api/v1/runs/{run_id}/logs", params={"limit": 100})
                .json()["items"]
            )
            greeting = [e["seq"] for e in items if e["stream"] == "stdout"]
            final = [
                e["seq"]
                for e in items
                if e["stream"] == "system" and e["line"].split(":", 1)[0] in FINISHED
            ]
            seqs = [e["seq"] for e in items]
            if not greeting or (final and min(final) < greeting[0]) or seqs != sorted(seqs):
                bad += 1
        return bad

    def close(self) -> None:
        for client in self.clients:
            client.close()


def deploy(server: Server, folder: Path, name: str, *, warm: bool, root: Path) -> None:
    """Deploy `folder` as worker `name`, with `warm: true` or without."""
    copy = root / "workers" / name
    shutil.copytree(folder, copy)
    manifest = (copy / "worker.yml").read_text().splitlines()
    manifest = [f"name: {name}" if line.startswith("name:") else line for line in manifest]
    (copy / "worker.yml").write_text("\n".join(manifest) + ("\nwarm: true\n" if warm else "\n"))
    archive = read_folder(copy, max_bytes=10 * 1024 * 1024).to_archive()
    resp = server.client.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    if resp.status_code not in (200, 201):
        raise RuntimeError(f"deploy of {name} answered {resp.status_code}: {resp.text[:300]}")


def await_pool(server: Server, runner: FloomRunner) -> None:
    """Run `runner`'s worker until its warm pool has a child ready (its first run records)."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        runner.one(0)
        warm = server.client.get("/healthz").json().get("warm") or {}
        pools = [p for p in warm.get("pools", []) if p["worker"] == runner.worker]
        if pools and pools[0]["ready"] > 0:
            return
    raise RuntimeError(f"the warm pool of {runner.worker} did not get ready")


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(system: Any, per_client: int) -> None:
    """`CLIENTS` clients, each running `per_client` runs one after another."""

    def loop(lane: int) -> None:
        for _ in range(per_client):
            system.one(lane)

    with ThreadPoolExecutor(CLIENTS) as pool:
        for f in [pool.submit(loop, lane) for lane in range(CLIENTS)]:
            f.result()


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class OwnCpu:
    """CPU seconds of this bench's process tree (client, server, warm processes, sandboxes,
    floor runs), through a cgroup v1 cpuacct group of its own that every process it starts
    inherits; without one, the whole machine's busy time (others' load included)."""

    def __init__(self) -> None:
        self.group: Path | None = None
        if (CPUACCT / "cpuacct.usage").exists():
            group = CPUACCT / f"floom-bench-{os.getpid()}"
            try:
                group.mkdir()
                (group / "cgroup.procs").write_text("0")
                self.group = group
            except OSError:
                self.group = None

    def seconds(self) -> float:
        if self.group is None:
            return machine_busy_seconds()
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @property
    def what(self) -> str:
        return "the bench's own process tree" if self.group else "the whole machine"

    def close(self) -> None:
        if self.group is not None:
            (CPUACCT / "cgroup.procs").write_text("0")
            with contextlib.suppress(OSError):
                self.group.rmdir()


class Meter:
    """CPU a run of the bench's own process tree and of the server process alone (its
    threads, not its warm processes or sandboxes), over what runs inside `measure`."""

    def __init__(self, own: OwnCpu, server: Server) -> None:
        self.own = own
        self.server = server

    def _server_seconds(self) -> float:
        return proc_cpu_seconds(self.server.proc.pid)

    def measure(self, fn: Callable[[], Any], runs: int) -> tuple[float, float, float]:
        """Seconds `fn` took, then CPU ms a run: the whole tree's and the server's."""
        busy, serving = self.own.seconds(), self._server_seconds()
        seconds = timed(fn)
        return (
            seconds,
            (self.own.seconds() - busy) * 1000 / runs,
            (self._server_seconds() - serving) * 1000 / runs,
        )


def measure_rates(
    systems: dict[str, Any],
    meter: Meter,
    args: argparse.Namespace,
    phases: list[str],
    sample: Path | None,
) -> tuple[dict[str, dict[str, tuple[float, float, float]]], dict[str, dict[str, list[float]]]]:
    """Runs/s, CPU ms a run and server CPU ms a run of each throughput system and phase
    ("4" clients, "burst"), over `--rate-rounds` rounds; and each round's ratio to the floor.
    The systems' order turns each round, so that a drift of the machine's speed (a VM's
    neighbours) falls on floor and floom alike."""
    totals: dict[str, dict[str, list[float]]] = {}  # runs, seconds, tree, server
    ratios: dict[str, dict[str, list[float]]] = {}
    rate_systems = [n for n in THROUGHPUT_SYSTEMS if n in systems]
    kinds = [k for k, phase in (("4", "clients"), ("burst", "burst")) if phase in phases]
    if rate_systems and kinds:
        say(
            f"throughput: {args.rate_rounds} rounds of {CLIENTS} clients x "
            f"{args.per_client} and a burst of {args.burst}, the order turning ..."
        )
    for i in range(args.rate_rounds):
        turned = rate_systems[i % len(rate_systems) :] + rate_systems[: i % len(rate_systems)]
        this_round: dict[str, dict[str, float]] = {}
        for name in turned:
            system = systems[name]
            for kind in kinds:
                if kind == "4":
                    runs = CLIENTS * args.per_client
                    seconds, tree, serving = meter.measure(
                        partial(throughput, system, args.per_client), runs
                    )
                else:
                    runs = args.burst
                    # hello warm's burst (hello cold's where warm does not run), once
                    sampled_name = "hello warm" if "hello warm" in systems else "hello cold"
                    sampling = sample is not None and name == sampled_name and i == 0
                    with sampled(sample if sampling else None):
                        seconds, tree, serving = meter.measure(
                            partial(system.burst, args.burst), runs
                        )
                total = totals.setdefault(name, {}).setdefault(kind, [0.0, 0.0, 0.0, 0.0])
                for j, value in enumerate((runs, seconds, tree * runs, serving * runs)):
                    total[j] += value
                this_round.setdefault(name, {})[kind] = runs / seconds
        for name in turned:
            for kind in kinds:
                floor = this_round["floor hello"][kind] if "floor hello" in this_round else 0
                if floor:
                    per = ratios.setdefault(name, {}).setdefault(kind, [])
                    per.append(this_round[name][kind] / floor)
    rates: dict[str, dict[str, tuple[float, float, float]]] = {
        name: {
            kind: (runs / seconds, tree / runs, serving / runs)
            for kind, (runs, seconds, tree, serving) in by_kind.items()
        }
        for name, by_kind in totals.items()
    }
    return rates, ratios


def parse_only(text: str | None) -> tuple[list[str], list[str]]:
    """`--only`'s parts and phases; an empty kind means all of it."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS and n not in PHASES]
    if unknown:
        raise SystemExit(
            f"--only: unknown part {', '.join(unknown)}; "
            f"choose from {', '.join(PARTS)} and {', '.join(PHASES)} (comma-separated)"
        )
    parts = [n for n in PARTS if n in names] or list(PARTS)
    phases = [n for n in PHASES if n in names] or list(PHASES)
    return parts, phases


def parse_settings(items: list[str]) -> dict[str, str]:
    """`--setting FLOOM_NAME=VALUE` items as the server's environment; ValueError for one
    that names no FLOOM_ setting."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("FLOOM_") or not name[6:]:
            raise ValueError(f"--setting {item!r}: give FLOOM_NAME=VALUE, e.g. FLOOM_WARM_READY=8")
        found[name] = value
    return found


@contextlib.contextmanager
def sampled(sample: Path | None) -> Iterator[None]:
    """The server's sampler (bench/sampler) samples during the block; its counts are in
    `sample` once the block has ended."""
    if sample is None:
        yield
        return
    switch = sample.with_name(sample.name + ".on")
    sample.unlink(missing_ok=True)
    switch.touch()
    try:
        yield
    finally:
        switch.unlink()
    deadline = time.monotonic() + SAMPLE_WRITE_SECONDS
    while not sample.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    say(f"thread samples of the burst: {sample}" if sample.exists() else "no samples")


def warm_stats(server: Server) -> dict[str, Any]:
    return server.client.get("/healthz").json().get("warm") or {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="latency rounds (default 30)")
    parser.add_argument("--per-client", type=int, default=15, help="runs per client loop")
    parser.add_argument("--burst", type=int, default=100, help="runs queued at once")
    parser.add_argument("--cpu-runs", type=int, default=20, help="sequential runs for CPU")
    parser.add_argument(
        "--rate-rounds",
        type=int,
        default=3,
        help="throughput rounds, each running every system once in a turning order (default 3)",
    )
    parser.add_argument(
        "--only",
        metavar="PARTS",
        help=f"comma-separated parts ({', '.join(PARTS)}) and phases ({', '.join(PHASES)}) "
        "to run; default all",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="FLOOM_NAME=VALUE",
        help="a setting for the server (repeatable), to compare settings side by side",
    )
    parser.add_argument(
        "--sample",
        metavar="FILE",
        help="sample the server's threads during the warm burst (the cold one with --only "
        "cold) and write the counts to FILE (bench/sampler/)",
    )
    args = parser.parse_args(argv)
    parts, phases = parse_only(args.only)
    try:
        settings = parse_settings(args.setting)
    except ValueError as exc:
        say(str(exc))
        return 2
    if os.geteuid() != 0:
        say("warm starts need a root floom: run the bench as root")
        return 2
    wanted = [n for n in ALL_SYSTEMS if any(n in PART_SYSTEMS[p] for p in parts)]
    root = Path(tempfile.mkdtemp(prefix="floom-bench-warm-"))
    one, five, _ = os.getloadavg()
    say(
        f"warm start benchmark: parts={','.join(parts)}, phases={','.join(phases)}, "
        f"rounds={args.runs}, per client={args.per_client}, "
        f"burst={args.burst}, cores={os.cpu_count()}, kernel {platform.release()}, "
        f"load average {one:.2f} {five:.2f}"
    )
    started = time.perf_counter()
    own = OwnCpu()  # before the server starts: it and its sandboxes are counted too
    # Hundreds of runs and log reads from one key: no per-key rate limit in the way.
    # The server runs this tree's floom (the venv's own may be another checkout's).
    server_env = {"FLOOM_RATE_LIMIT_PER_MINUTE": "0", "PYTHONPATH": str(REPO), **settings}
    sample = Path(args.sample).resolve() if args.sample else None
    if sample is not None:
        server_env["PYTHONPATH"] = f"{SAMPLER}{os.pathsep}{REPO}"
        server_env["BENCH_SAMPLE"] = str(sample)
    server = Server(root / "server", None, server_env)
    meter = Meter(own, server)
    runners: list[FloomRunner] = []
    try:
        server.wait_ready()
        systems: dict[str, Any] = {}
        for name in wanted:
            worker, how = name.split()
            if worker == "floor":
                systems[name] = FloorRunner(
                    name, root / "floor", HELLO if how == "hello" else HEAVY
                )
                continue
            deploy(
                server,
                HELLO if worker == "hello" else HEAVY,
                f"b-{worker}-{how}",
                warm=how == "warm",
                root=root,
            )
            systems[name] = FloomRunner(f"floom {name}", server, f"b-{worker}-{how}")
        runners = [s for s in systems.values() if isinstance(s, FloomRunner)]
        for runner in runners:
            if runner.worker.endswith("warm"):
                await_pool(server, runner)
            for _ in range(3):
                runner.one(0)
        warm0 = warm_stats(server)
        for system in systems.values():
            if isinstance(system, FloorRunner):
                system.one(0)

        order = list(systems)
        lat: dict[str, list[float]] = {name: [] for name in order}
        if "latency" in phases:
            say(f"latency: {args.runs} interleaved rounds ...")
            for i in range(args.runs):
                for name in order[i % len(order) :] + order[: i % len(order)]:
                    lat[name].append(systems[name].one(0))
        cpu: dict[str, tuple[float, float]] = {}
        if "cpu" in phases:
            say(f"CPU: {args.cpu_runs} sequential runs of each ...")
            for name, system in systems.items():

                def sequential(system: Any = system) -> list[float]:
                    return [system.one(0) for _ in range(args.cpu_runs)]

                _, tree, serving = meter.measure(sequential, args.cpu_runs)
                cpu[name] = (tree, serving)
            say(f"(CPU counted: {own.what})")
        rates, ratios = measure_rates(systems, meter, args, phases, sample)
        warm1 = warm_stats(server)
        bad = {runner.name: runner.bad_logs() for runner in runners}
        total = {runner.name: len(runner.run_ids) for runner in runners}
        report(lat, cpu, rates, ratios, warm0, warm1, bad, total)
    finally:
        for runner in runners:
            runner.close()
        server.stop()
        own.close()
        shutil.rmtree(root, ignore_errors=True)
    say(f"bench took {time.perf_counter() - started:.0f} s")
    return 0


def report(
    lat: dict[str, list[float]],
    cpu: dict[str, tuple[float, float]],
    rates: dict[str, dict[str, tuple[float, float, float]]],
    ratios: dict[str, dict[str, list[float]]],
    warm0: dict[str, Any],
    warm1: dict[str, Any],
    bad: dict[str, int],
    total: dict[str, int],
) -> None:
    """The measured figures as ratios to their floor, and the targets that they allow."""

    def floor_of(name: str) -> str:
        return "floor hello" if "hello" in name else "floor heavy"

    def lat_ratio(name: str) -> float:
        return median(lat[name]) / median(lat[floor_of(name)])

    def cpu_ratio(name: str) -> float:
        return cpu[name][0] / cpu[floor_of(name)][0]

    say("")
    if any(lat.values()) or cpu:
        rows = [("", "latency p50", "vs its floor", "CPU/run", "vs its floor", "server CPU/run")]
        for name in lat:
            p50 = median(lat[name])
            rows.append(
                (
                    name,
                    f"{p50 * 1000:.1f} ms" if lat[name] else "-",
                    f"{lat_ratio(name):.2f}x" if lat[name] else "-",
                    f"{cpu[name][0]:.1f} ms" if cpu else "-",
                    f"{cpu_ratio(name):.2f}x" if cpu else "-",
                    f"{cpu[name][1]:.1f} ms" if cpu and "floor" not in name else "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        say("")
    floor_rates = rates.get("floor hello", {})
    for name, r in rates.items():
        for kind, label in (("4", f"at {CLIENTS} clients"), ("burst", "in a burst")):
            if kind not in r:
                continue
            rate, tree, serving = r[kind]
            server_part = "" if "floor" in name else f", server {serving:.1f} ms"
            per_round = ratios.get(name, {}).get(kind, [])
            spread = (
                f", rounds {min(per_round):.2f}x to {max(per_round):.2f}x"
                if len(per_round) > 1 and "floor" not in name
                else ""
            )
            say(
                f"{name}: {rate:.1f} runs/s {label} ({rate / floor_rates[kind][0]:.2f}x"
                f"{spread}); CPU a run {tree:.1f} ms{server_part}"
            )
    hits = warm1.get("hits", 0) - warm0.get("hits", 0)
    misses = warm1.get("misses", 0) - warm0.get("misses", 0)
    say(f"warm pools during the measured phases: {hits} hits, {misses} misses")
    say("")

    def rate_ratio(name: str, kind: str) -> float:
        return rates[name][kind][0] / floor_rates[kind][0]

    checks: list[tuple[str, float, float, bool]] = []  # label, value, bound, at most?
    if lat.get("hello warm"):
        label = f"hello warm latency p50 <= {HELLO_LATENCY}x floor"
        checks.append((label, lat_ratio("hello warm"), HELLO_LATENCY, True))
    for kind, label in (("4", f"at {CLIENTS} clients"), ("burst", "in a burst")):
        if kind in rates.get("hello warm", {}):
            text = f"hello warm throughput >= {HELLO_THROUGHPUT}x floor {label}"
            checks.append((text, rate_ratio("hello warm", kind), HELLO_THROUGHPUT, False))
    if lat.get("heavy warm"):
        label = f"heavy warm latency p50 <= {HEAVY_LATENCY}x its floor"
        checks.append((label, lat_ratio("heavy warm"), HEAVY_LATENCY, True))
    if "heavy warm" in cpu:
        label = f"heavy warm CPU/run <= {HEAVY_CPU}x its floor's"
        checks.append((label, cpu_ratio("heavy warm"), HEAVY_CPU, True))
    if lat.get("hello cold"):
        label = f"cold guard: hello cold latency p50 <= {COLD_LATENCY}x floor"
        checks.append((label, lat_ratio("hello cold"), COLD_LATENCY, True))
    cold_kinds = [k for k in ("4", "burst") if k in rates.get("hello cold", {})]
    if cold_kinds:
        which = ", ".join(f"{CLIENTS} clients" if k == "4" else "burst" for k in cold_kinds)
        label = f"cold guard: hello cold throughput >= {COLD_THROUGHPUT}x floor ({which})"
        value = min(rate_ratio("hello cold", k) for k in cold_kinds)
        checks.append((label, value, COLD_THROUGHPUT, False))
    done = "every run succeeded, logs complete and ordered"
    width = max([len(c[0]) for c in checks] + [len(done)])
    for label, value, bound, at_most in checks:
        ok = value <= bound if at_most else value >= bound
        say(f"{label.ljust(width)}  {value:.2f}x  {'OK' if ok else 'MISS'}")
    all_bad = sum(bad.values())
    runs = sum(total.values())
    say(f"{done.ljust(width)}  {runs - all_bad}/{runs}  {'OK' if all_bad == 0 else 'MISS'}")


if __name__ == "__main__":
    raise SystemExit(main())
