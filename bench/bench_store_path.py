"""The store's part of a run, alone: CPU a run of each of its store steps, in this process.

Each run goes the way a burst's runs go, without a sandbox or HTTP: queued (create_run, no
slot free here), claimed (the executor's claim_next), ended (finish_attempt: a success with
its last log line and an artifact) and read as a waiter reads it (peek_run and the record).
One thread, so a step's CPU is about its time in its transaction, and on SQLite about how
long it holds the write lock. The floom imported is the one PYTHONPATH names, so the same
script measures two trees:

    PYTHONPATH=/path/to/tree .venv/bin/python bench/bench_store_path.py [--runs 400]
        [--postgres] [--rounds 5]

Prints the median over rounds of each step's CPU a run (us), and their sum.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import floom
from floom.bundle import read_folder
from floom.config import Settings
from floom.engine.queue import Outcome, claim_next, finish_attempt
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle
from floom.services.runs.records import record_in_session
from floom.services.workers import versions
from floom.store.db import read_connection
from floom.store.models import Run
from floom.vocabulary import RunStatus

MANIFEST = "name: hello\nentry: run.py\ninputs:\n  name: {type: string}\n"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
STEPS = ("queue", "claim", "end", "read")

T = TypeVar("T")


def _context(root: Path, url: str) -> Context:
    settings = Settings(
        data_dir=root / "data",
        database_url=url,
        deploy_examples=False,
        secret_key="bench-store-path",
    )
    return Context.open(settings)


def _deploy(ctx: Context, root: Path) -> None:
    folder = root / "hello"
    folder.mkdir()
    (folder / "worker.yml").write_text(MANIFEST)
    (folder / "run.py").write_text("print('hello')\n")
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    versions.deploy(ctx, caller=SYSTEM, archive=archive)


def _timed(fn: Callable[[], T], into: list[float]) -> T:
    t0 = time.thread_time()
    found = fn()
    into.append(time.thread_time() - t0)
    return found


def _round(ctx: Context, runs: int) -> dict[str, float]:
    spent: dict[str, list[float]] = {step: [] for step in STEPS}
    for n in range(runs):

        def queue(n: int = n) -> Run:
            return lifecycle.create_run(
                ctx, caller=SYSTEM, worker_name="hello", inputs={"name": f"b{n}"}
            )

        queued = _timed(queue, spent["queue"])
        run = _timed(lambda: claim_next(ctx, look_first=False).run, spent["claim"])
        if run is None or run.id != queued.id:
            raise RuntimeError("the claim did not take the run just queued")
        outcome = Outcome(
            status=RunStatus.SUCCEEDED,
            outputs={"greeting": "hello"},
            exit_code=0,
            sandbox_seconds=0.01,
            artifacts=[("out.txt", f"artifact {n % 4}".encode(), "text/plain")],
        )

        def end(run: Run = run, outcome: Outcome = outcome) -> str:
            return finish_attempt(
                ctx,
                run=run,
                outcome=outcome,
                backoff=0,
                log_lines=[("stdout", "Hello, bench!", None)],
            )

        ended = _timed(end, spent["end"])
        if ended != "succeeded":
            raise RuntimeError(f"run ended {ended}")

        def read(run_id: str = run.id) -> None:
            with read_connection(ctx.engine) as conn:
                record_in_session(ctx, conn, lifecycle.peek_run(conn, run_id))

        _timed(read, spent["read"])
    return {step: sum(values) * 1e6 / runs for step, values in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        database = None
        if args.postgres:
            import psycopg

            database = f"floom_bench_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{database}"')
            url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"
        else:
            url = f"sqlite:///{root / 'floom.db'}"
        try:
            ctx = _context(root, url)
            try:
                _deploy(ctx, root)
                _round(ctx, 50)  # warm-up: caches, prepared statements
                rounds = [_round(ctx, args.runs) for _ in range(args.rounds)]
            finally:
                ctx.engine.dispose()
        finally:
            if database is not None:
                import psycopg

                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    store = "postgresql" if args.postgres else "sqlite"
    print(
        f"floom from {Path(floom.__file__).parent.parent}, {store}, {args.runs} runs x "
        f"{args.rounds} rounds; CPU a run in us (median of rounds; min-max)"
    )
    total = [sum(r.values()) for r in rounds]
    for step in STEPS:
        values = [r[step] for r in rounds]
        print(
            f"  {step:6} {statistics.median(values):8.0f}   ({min(values):.0f}-{max(values):.0f})"
        )
    print(f"  {'total':6} {statistics.median(total):8.0f}   ({min(total):.0f}-{max(total):.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
