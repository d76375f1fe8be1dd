"""Three scheduler nodes on one PostgreSQL fire each tick of a schedule exactly once, also
while one of them is killed with kill -9 as a tick falls due.

The nodes are processes running floom's Scheduler on a fast clock (its injectable clock,
30 times real time), so a once-a-minute schedule ticks every 2 s.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import col, select

from floom.bundle import read_folder
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run
from tests.support.harness import REPO, fast_settings, make_worker, wait_until

SPEED = 30.0  # a minute of the schedule's clock every 2 s
TICK = 60.0 / SPEED

MANIFEST = """\
name: every-minute
triggers:
  - schedule: {cron: "* * * * *", overlap: allow, catch_up: all}
"""


def schedule_runs(ctx: Context) -> list[Run]:
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(Run).where(col(Run.scheduled_for).is_not(None))).all())


def start_node(
    root: Path, database_url: str, name: str, clock_start: float
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env.update(
        PYTHONPATH=str(REPO),
        SPEED=str(SPEED),
        CLOCK_START=str(clock_start),
        FLOOM_DATA_DIR=str(root / name),
        FLOOM_DATABASE_URL=database_url,
        FLOOM_NODE_ID=name,
        FLOOM_SECRET_KEY="test-secret-key",
    )
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "processes" / "scheduler_node.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)  # closes its stdout too


@pytest.fixture
def scheduler_ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    ctx = Context.open(fast_settings(tmp_path / "deployer", database_url))
    yield ctx
    ctx.engine.dispose()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_three_schedulers_fire_each_tick_once_while_one_is_killed_at_a_tick(
    tmp_path: Path, database_url: str, scheduler_ctx: Context
) -> None:
    folder = make_worker(tmp_path / "w", MANIFEST, {"run.sh": "true\n"})
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    workers.deploy(scheduler_ctx, caller=SYSTEM, archive=archive)
    clock_start = time.time()
    with ExitStack() as stack:
        nodes = []
        for i in range(3):
            proc = start_node(tmp_path, database_url, f"sched{i}", clock_start)
            stack.callback(kill, proc)
            nodes.append(proc)
        for proc in nodes:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
        wait_until(lambda: len(schedule_runs(scheduler_ctx)) >= 1, timeout=4 * TICK)
        # Kill a node just as the next tick falls due, when every node is firing it.
        elapsed = time.time() - clock_start
        next_tick = clock_start + (int(elapsed / TICK) + 1) * TICK
        time.sleep(max(0.0, next_tick - time.time()) + 0.01)
        kill(nodes[0])
        killed_at = datetime.fromtimestamp(clock_start, UTC)
        killed_at += (datetime.fromtimestamp(time.time(), UTC) - killed_at) * SPEED
        # Two more ticks on the two nodes left.
        wait_until(
            lambda: (
                sum(
                    r.scheduled_for is not None and r.scheduled_for > killed_at
                    for r in schedule_runs(scheduler_ctx)
                )
                >= 2
            ),
            timeout=6 * TICK,
        )
    runs = schedule_runs(scheduler_ctx)
    ticks_of = [r.scheduled_for for r in runs]
    per_tick = Counter(t for t in ticks_of if t is not None)
    assert len(per_tick) == len(set(ticks_of)), ticks_of
    assert per_tick, per_tick
    assert set(per_tick.values()) == {1}, per_tick
    ticks = sorted(per_tick)
    minutes = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    assert set(minutes) == {60.0}, ticks  # no tick lost either
    assert len(ticks) >= 3
    assert {r.status for r in runs} == {"queued"}  # each a run, none recorded as missed
