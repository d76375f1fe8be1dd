"""Benchmark: the E2B backend's per-run overhead against the wire-level stand-in, next to the
local backend, and the requests one run makes to E2B.

Run from the repository root:

    .venv/bin/python bench/bench_e2b.py [--runs N] [--files F]

Each backend runs the same trivial script N times (a bundle of F small files plus run.py,
writing result.json and one artifact), sequentially, through `Sandbox.run`, and the figures
are wall time per run (median, p90) and the E2B/local ratio. The stand-in executes commands
through floom's LocalSandbox, so the ratio is the cost of E2B's protocol (create, one upload,
unpack, command, pack, one download, kill) over loopback, not of a real microVM or of the
network to E2B. It prints the figures and asserts nothing; all traffic is on 127.0.0.1.
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
from tests.standins.e2b import running_e2b_standin

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--files", type=int, default=50)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
