"""Benchmark: schedule fire-time skew, from a tick's scheduled time to its run's start.

Run from the repository root:

    .venv/bin/python bench/bench_triggers.py [--ticks N] [--workers W]

The embedded default: one process with the scheduler and the executor, SQLite in a fresh
data dir, the local (bubblewrap) sandbox. W workers each have the schedule `* * * * *`, so
every minute boundary is a tick of each.

Cron has minute resolution, and waiting for N real minutes is slow, so the scheduler runs
on a shifted clock: real time plus an offset. After each tick the offset jumps so that the
next minute boundary is LEAD seconds ahead; the scheduler then sleeps, wakes and fires in
real time exactly as it would before a real boundary (no boundary is skipped, so nothing is
missed). Skew is the run's start (the executor's claim, `started_at`, shifted by the same
offset) minus its scheduled time. It also splits the skew into tick-to-queued (scheduler)
and queued-to-started (executor pickup).

It prints p50, p99 and max against the target p99 < 1 s; it asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import col, select

from floom.services.access.principal import SYSTEM

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from floom.agent.runner import run_agent  # noqa: E402
from floom.bundle import read_folder  # noqa: E402
from floom.config import Settings  # noqa: E402
from floom.engine.executor import Executor  # noqa: E402
from floom.engine.loops.scheduler import Scheduler  # noqa: E402
from floom.sandbox import get_sandbox  # noqa: E402
from floom.services.context import Context  # noqa: E402
from floom.services.workers import versions as workers  # noqa: E402
from floom.store.db import session_scope  # noqa: E402
from floom.store.models import Run  # noqa: E402

TARGET_P99_SECONDS = 1.0
LEAD_SECONDS = 0.8  # how far ahead of the next boundary each jump lands
TICK_DEADLINE_SECONDS = 30.0
SCRIPT = 'import json\njson.dump({"outputs": {}}, open("result.json", "w"))\n'


class ShiftedClock:
    """Real time plus an adjustable offset."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def jump_before_next_boundary(self) -> datetime:
        """Shift so the next minute boundary is LEAD seconds away; return that boundary."""
        now = self()
        boundary = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        self.offset += boundary - timedelta(seconds=LEAD_SECONDS) - now
        return boundary


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def deploy(ctx: Context, root: Path, name: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "worker.yml").write_text(
        f"name: {name}\nlimits: {{timeout_seconds: 30}}\ntriggers:\n"
        '  - schedule: {cron: "* * * * *", overlap: allow, catch_up: none}\n'
    )
    (folder / "run.py").write_text(SCRIPT)
    workers.deploy(ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**7).to_archive())


def started_runs(ctx: Context, boundary: datetime) -> list[Run]:
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(Run).where(
                    Run.trigger == "schedule",
                    Run.scheduled_for == boundary,
                    col(Run.started_at).is_not(None),
                )
            ).all()
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20, help="minute boundaries to fire")
    parser.add_argument("--workers", type=int, default=3, help="schedules firing per boundary")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="floom-bench-triggers-"))
    settings = Settings(data_dir=root / "data", deploy_examples=False, executor_slots=4)
    ctx = Context.open(settings)
    sandbox = get_sandbox(settings.sandbox)
    sandbox.check()
    executor = Executor(ctx, sandbox, run_agent=run_agent)
    clock = ShiftedClock()
    scheduler = Scheduler(ctx, clock=clock)
    skews: list[float] = []
    queued: list[float] = []
    pickup: list[float] = []
    try:
        names = [f"tick-{i}" for i in range(args.workers)]
        for name in names:
            deploy(ctx, root / "workers", name)
        executor.start()
        boundary = clock.jump_before_next_boundary()
        scheduler.start()
        for _ in range(args.ticks):
            deadline = time.monotonic() + TICK_DEADLINE_SECONDS
            while True:
                rows = started_runs(ctx, boundary)
                if len(rows) == len(names):
                    break
                if time.monotonic() > deadline:
                    print(f"tick {boundary.isoformat()}: only {len(rows)} runs started in time")
                    return 1
                time.sleep(0.005)
            for run in rows:
                assert run.started_at is not None
                skews.append((run.started_at + clock.offset - boundary).total_seconds())
                queued.append((run.created_at + clock.offset - boundary).total_seconds())
                pickup.append((run.started_at - run.created_at).total_seconds())
            boundary = clock.jump_before_next_boundary()
            scheduler.wake()
    finally:
        scheduler.stop()
        executor.stop()
        ctx.engine.dispose()
        shutil.rmtree(root, ignore_errors=True)

    def line(label: str, values: list[float]) -> str:
        return (
            f"{label:<28} p50 {statistics.median(values) * 1000:7.1f} ms   "
            f"p99 {percentile(values, 99) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms"
        )

    p99 = percentile(skews, 99)
    print(f"fire-time skew, {len(skews)} fires ({args.ticks} ticks x {args.workers} schedules),")
    print("embedded default: SQLite, scheduler + executor in one process, local sandbox")
    print(line("scheduled -> run started", skews))
    print(line("  scheduled -> queued", queued))
    print(line("  queued -> started", pickup))
    verdict = "OK" if p99 < TARGET_P99_SECONDS else "MISS"
    print(f"target: p99 < {TARGET_P99_SECONDS * 1000:.0f} ms ... {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
