"""Cleaning up after runs off their path: work dirs removed in the background (deleting a
tree costs milliseconds that an executor slot should spend on the next run), and sandboxes
left running by a node that died, reaped through each backend."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from floom.sandbox.base import Sandbox

log = logging.getLogger("floom.cleanup")

# How long a discarded work dir waits before it is deleted. A run's end is recorded just
# before its work dir is discarded, and its waiter then reads and answers on other threads:
# deleting the tree at once made this thread hold the GIL right when they needed it (each
# of the few dozen system calls of a removal hands the GIL back and forth), which delayed
# the answer by milliseconds. A moment later the answer has gone out.
DELAY_SECONDS = 0.1

_pending: queue.SimpleQueue[tuple[float, Path]] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _drain() -> None:
    while True:
        due, path = _pending.get()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        shutil.rmtree(path, ignore_errors=True)


def discard_later(path: Path) -> None:
    """Delete `path` soon, in a background thread. It is renamed first, so a new dir of the
    same name (the same run again on this node) is never touched. A restart clears anything
    left behind (the executor empties its work root on start)."""
    global _thread
    trash = path.with_name(f"{path.name}.trash-{os.urandom(4).hex()}")
    try:
        path.rename(trash)
    except FileNotFoundError:
        return
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_drain, name="floom-cleanup", daemon=True)
            _thread.start()
    _pending.put((time.monotonic() + DELAY_SECONDS, trash))


def reap_sandbox_orphans(
    backends: Iterable[Sandbox],
    *,
    node_id: str,
    work_root: Path,
    live_run_ids: Callable[[], Collection[str]],
) -> int:
    """Have every backend kill the sandboxes this node left to runs it no longer runs;
    returns how many went. A backend that fails is logged and tried on the next pass."""
    killed = 0
    for backend in backends:
        try:
            killed += backend.reap_orphans(
                node_id=node_id, work_root=work_root, live_run_ids=live_run_ids
            )
        except Exception:  # one backend's outage must not stop the others or the loop
            log.exception("reaping orphaned %s sandboxes failed; retrying later", backend.name)
    return killed
