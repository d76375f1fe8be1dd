"""A thread sampler for a bench's `floom serve` (bench_warm.py --sample FILE), for where py-spy
cannot attach ("Failed to find python version" on this machine's interpreter).

Loaded by Python at start-up when this directory leads PYTHONPATH: in a `serve` process with
BENCH_SAMPLE set, a daemon thread takes every thread's Python stack about every 4 ms while
the file BENCH_SAMPLE + ".on" exists, and writes the counts to BENCH_SAMPLE (JSON: a list of
[[thread name without its number, [frames, outermost first]], samples]) once it is gone.
A thread waiting (on a lock, a socket, the GIL) is sampled where it waits, as with py-spy's
--idle. `python3 bench/sampler/sitecustomize.py FILE` prints each thread kind's time by
its deepest floom frame.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from types import FrameType

PERIOD_SECONDS = 0.004


def _sample(out: str) -> None:
    switch = out + ".on"
    me = threading.get_ident()
    counts: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
    active = False
    while True:
        time.sleep(PERIOD_SECONDS)
        if not os.path.exists(switch):
            if active:
                with open(out + ".tmp", "w") as f:
                    json.dump([[list(k), v] for k, v in counts.most_common()], f)
                os.replace(out + ".tmp", out)
                counts.clear()
                active = False
            continue
        active = True
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack: list[str] = []
            at: FrameType | None = frame
            while at is not None and len(stack) < 60:
                code = at.f_code
                stack.append(f"{_short(code.co_filename)}:{code.co_name}:{at.f_lineno}")
                at = at.f_back
            name = names.get(ident, "?").rstrip("0123456789_-() ")
            counts[(name, tuple(reversed(stack)))] += 1


def _short(filename: str) -> str:
    """floom's files from the package's folder on (floom/engine/queue.py), others by name."""
    _, found, tail = filename.rpartition("/floom/")
    return f"floom/{tail}" if found else os.path.basename(filename)


def summarize(path: str) -> None:
    """Print each thread kind's samples by its deepest frame in floom."""
    with open(path) as f:
        data = json.load(f)
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (name, stack), n in data:
        where = next(
            (s.rsplit(":", 1)[0] for s in reversed(stack) if s.startswith("floom/")),
            "?",
        )
        by_kind[name][where] += n
    for name, found in sorted(by_kind.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(found.values())
        print(f"{name}: {total} samples")
        for where, n in found.most_common(15):
            print(f"  {100 * n / total:5.1f}%  {where}")


if __name__ == "__main__":
    summarize(sys.argv[1])
elif os.environ.get("BENCH_SAMPLE") and "serve" in sys.argv:
    threading.Thread(
        target=_sample, args=(os.environ["BENCH_SAMPLE"],), name="bench-sampler", daemon=True
    ).start()
