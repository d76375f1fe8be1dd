"""A scheduler node on a fast clock, as a process of its own
(tests/e2e/nodes/test_cluster_scheduler.py).

Settings come from FLOOM_* variables; the clock runs SPEED times faster than real time
from the instant CLOCK_START (both in the environment). The process runs until killed.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta

from floom.config import Settings
from floom.engine.loops.scheduler import Scheduler
from floom.services.context import Context


def main() -> None:
    speed = float(os.environ["SPEED"])
    start = float(os.environ["CLOCK_START"])
    origin = datetime.fromtimestamp(start, UTC)

    def fast_clock() -> datetime:
        return origin + timedelta(seconds=(time.time() - start) * speed)

    ctx = Context.open(Settings())
    Scheduler(ctx, clock=fast_clock).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
