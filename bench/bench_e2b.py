"""Benchmark: the E2B backend's per-run overhead against the wire-level stand-in, next to the
local backend, and the requests one run makes to E2B.

Run from the repository root:

    .venv/bin/python bench/bench_e2b.py [--runs N] [--files F] [--part overhead|start|all]
        [--submits N] [--delay SECONDS]

Part `overhead`: each backend runs the same trivial script N times (a bundle of F small
files plus run.py, writing result.json and one artifact), sequentially, through
`Sandbox.run`, and the figures are wall time per run (median, p90) and the E2B/local
ratio. The stand-in executes commands through floom's LocalSandbox, so the ratio is the
cost of E2B's protocol (create, one upload, the command unpacking it first, pack, one
download, kill) over loopback, not of a real microVM or of the network to E2B.

Part `start` (issue 29): submit-to-start through two real `floom serve` (SQLite,
FLOOM_SANDBOX=e2b) on one stand-in whose creates take `--delay` seconds (a microVM booting):
one with FLOOM_E2B_WARM=2 (sandboxes created ahead of runs), one without; runs alternate
between them, one at a time, `--submits` each. Per run: submit (the client's POST) to the
moment E2B's envd got the run's command (the stand-in records it), to the script's first
statement (it reports time.monotonic(); includes the stand-in's own bubblewrap start, which
real E2B does not have), and to the run's end. It prints p50 / p90 of each, warm and cold,
and the target (warm submit-to-start p50 <= 50 ms) with OK/MISS. It asserts nothing but
that every run succeeded; all traffic is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from floom.config import Settings
from floom.sandbox import get_sandbox
from floom.sandbox.base import Sandbox, SandboxSpec
from tests.standins.e2b import E2BStandin, running_e2b_standin

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from server import Server  # noqa: E402

from floom.bundle import read_folder  # noqa: E402

START_TARGET_MS = 50.0
WARM_COUNT = 2
STARTED = (
    "import time\n"
    "t = time.monotonic()\n"
    "import json\n"
    "json.dump({'outputs': {'t': t}}, open('result.json', 'w'))\n"
    "print('started')\n"
)

SCRIPT = (
    "import json, os\n"
    "json.dump({'outputs': {'ok': True}}, open('result.json', 'w'))\n"
    "open(os.path.join(os.environ['FLOOM_OUTPUT_DIR'], 'a.txt'), 'w').write('x')\n"
    "print('done')\n"
)


def one_run(sandbox: Sandbox, root: Path, files: int, n: int) -> float:
    base = root / f"run-{n}"
    workdir, output_dir = base / "work", base / "output"
    workdir.mkdir(parents=True)
    output_dir.mkdir()
    (workdir / "run.py").write_text(SCRIPT)
    for i in range(files):
        (workdir / f"data_{i}.txt").write_text(f"row {i}\n" * 20)
    spec = SandboxSpec(
        run_id=f"run_bench_{n}",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        metadata={"floom_run_id": f"run_bench_{n}", "floom_node": "bench"},
    )
    t0 = time.perf_counter()
    result = sandbox.run(spec, on_line=lambda *line: None, should_cancel=lambda: False)
    seconds = time.perf_counter() - t0
    if result.exit_code != 0 or not (output_dir / "a.txt").is_file():
        raise SystemExit(f"{sandbox.name}: the run failed: {result}")
    return seconds


def figures(label: str, times: list[float]) -> float:
    ordered = sorted(times)
    median = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    print(
        f"{label:>6}: median {median * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  ({len(times)} runs)"
    )
    return median


def overhead(args: argparse.Namespace) -> None:
    with (
        running_e2b_standin() as standin,
        tempfile.TemporaryDirectory(prefix="floom-bench-e2b-") as scratch,
    ):
        os.environ.update(standin.env)
        os.environ.pop("E2B_DOMAIN", None)
        e2b = get_sandbox("e2b", Settings(e2b_api_key=standin.api_key))
        local = get_sandbox("local", Settings())
        root = Path(scratch)
        one_run(local, root / "warm-local", args.files, 0)  # probes bwrap once
        one_run(e2b, root / "warm-e2b", args.files, 0)  # imports and connects once
        standin.reset_counts()
        e2b_times = [one_run(e2b, root / "e2b", args.files, n) for n in range(args.runs)]
        requests = sum(standin.requests.values()) / args.runs
        local_times = [one_run(local, root / "local", args.files, n) for n in range(args.runs)]
    print(f"one run: run.py + {args.files} files, result.json and one artifact back")
    local_median = figures("local", local_times)
    e2b_median = figures("e2b", e2b_times)
    extra_ms = (e2b_median - local_median) * 1000
    print(f"e2b/local: {e2b_median / local_median:.2f}x  (+{extra_ms:.0f} ms per run)")
    print(f"requests to E2B per run: {requests:g}")


class StartServer:
    """One `floom serve` running scripts in E2B (the stand-in), warm or not."""

    def __init__(self, root: Path, standin: E2BStandin, *, warm: int) -> None:
        env = {
            **standin.env,
            "FLOOM_SANDBOX": "e2b",
            "FLOOM_E2B_API_KEY": standin.api_key,
            "FLOOM_E2B_WARM": str(warm),
            "FLOOM_DEPLOY_EXAMPLES": "false",
            "FLOOM_RATE_LIMIT_PER_MINUTE": "0",
        }
        self.warm = warm
        self.server = Server(root, None, env)
        self.server.wait_ready()
        folder = root / "worker"
        folder.mkdir()
        (folder / "worker.yml").write_text("name: started\noutputs: {t: {type: number}}\n")
        (folder / "run.py").write_text(STARTED)
        archive = read_folder(folder, max_bytes=1024 * 1024).to_archive()
        resp = self.server.client.post(
            "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
        )
        if resp.status_code not in (200, 201):
            raise SystemExit(f"deploy answered {resp.status_code}: {resp.text[:300]}")

    def one(self, standin: E2BStandin) -> tuple[float, float, float]:
        """One run: seconds from submit to its command reaching envd, to its script's first
        statement, to its end (seen by the client)."""
        client = self.server.client
        seen = len(standin.command_starts)
        t0 = time.monotonic()
        resp = client.post("/api/v1/workers/started/runs", params={"wait": "30"}, json={})
        run = resp.json()
        while run.get("status") not in ("succeeded", "failed", "cancelled", "timed_out"):
            run = client.get(f"/api/v1/runs/{run['id']}", params={"wait": "30"}).json()
        done = time.monotonic()
        if run["status"] != "succeeded":
            raise SystemExit(f"a run did not succeed: {run}")
        started = [t for t, _, line in standin.command_starts[seen:] if "run.py" in line]
        return started[0] - t0, run["outputs"]["t"] - t0, done - t0

    def healthz(self) -> dict[str, object]:
        found: dict[str, object] = self.server.client.get("/healthz").json()
        return found

    def stop(self) -> None:
        self.server.stop()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def start(args: argparse.Namespace) -> None:
    with (
        running_e2b_standin(creation_delay=args.delay) as standin,
        tempfile.TemporaryDirectory(prefix="floom-bench-e2b-start-") as scratch,
    ):
        root = Path(scratch)
        servers = {
            "cold": StartServer(root / "cold", standin, warm=0),
            "warm": StartServer(root / "warm", standin, warm=WARM_COUNT),
        }
        try:
            for server in servers.values():
                server.one(standin)  # the first run: imports, connects, starts the pool
            time.sleep(args.delay * 3)
            figures: dict[str, list[tuple[float, float, float]]] = {k: [] for k in servers}
            for _ in range(args.submits):
                for name, server in servers.items():
                    figures[name].append(server.one(standin))
            warm = servers["warm"].healthz().get("warm")
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"submit-to-start, {args.submits} runs each, one at a time, warm and cold alternating; "
        f"E2B stand-in creating sandboxes in {args.delay * 1000:.0f} ms"
    )
    print(f"{'':>5} {'to command p50/p90':>20} {'to script p50/p90':>20} {'to end p50/p90':>18}")
    for name, rows in figures.items():
        cells = []
        for column in range(3):
            values = [row[column] * 1000 for row in rows]
            cells.append(f"{percentile(values, 0.5):7.1f} /{percentile(values, 0.9):7.1f}")
        print(f"{name:>5} {cells[0]:>20} {cells[1]:>20} {cells[2]:>18}  ms")
    e2b = (warm or {}).get("e2b") if isinstance(warm, dict) else None
    if isinstance(e2b, dict):
        print(f"warm server's pool: {e2b['hits']} hits, {e2b['misses']} misses")
    warm_p50 = percentile([row[0] * 1000 for row in figures["warm"]], 0.5)
    verdict = "OK" if warm_p50 <= START_TARGET_MS else "MISS"
    print(
        f"target: warm submit-to-start p50 <= {START_TARGET_MS:g} ms: {warm_p50:.1f} ms {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("overhead", "start", "all"), default="all")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.3)
    args = parser.parse_args()
    if args.part in ("overhead", "all"):
        overhead(args)
    if args.part in ("start", "all"):
        start(args)


if __name__ == "__main__":
    main()
