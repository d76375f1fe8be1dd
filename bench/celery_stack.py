"""The do-it-yourself alternative the bench compares floom with: a Celery task on Redis that runs
the same bubblewrap command as the floor (bench/floor.py) and returns the script's outputs.

Used two ways: `celery -A celery_stack worker` loads it in the worker (prefork: each child
keeps one private copy of workers/hello, so its runs never share a directory), and the bench
imports it to send tasks. Broker and result backend: BENCH_REDIS_URL (default
redis://127.0.0.1:6379/15); queue: BENCH_CELERY_QUEUE, unique per bench run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery
from floor import FloorSlot

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "floom_bench")

app = Celery("floom_bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,  # the nearest Celery gets to floom's "a crash re-runs the run"
    worker_prefetch_multiplier=1,
    result_expires=600,
    broker_connection_retry_on_startup=True,
)

_slot: Any = None


@app.task(name="floom_bench.run_hello")  # type: ignore[untyped-decorator]  # Celery is untyped
def run_hello() -> dict[str, Any]:
    """Run hello once in this worker child's own copy; the outputs it wrote."""
    global _slot
    if _slot is None:
        root = Path(os.environ.get("BENCH_ROOT") or tempfile.mkdtemp(prefix="floom-bench-"))
        _slot = FloorSlot(root / "celery", f"child{os.getpid()}")
    _slot.run_once()
    outputs: dict[str, Any] = json.loads((_slot.workdir / "result.json").read_text())["outputs"]
    return outputs
