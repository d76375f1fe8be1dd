"""Removing run work dirs off the run's path: deleting a tree costs milliseconds that an
executor slot should spend on the next run."""

from __future__ import annotations

import os
import queue
import shutil
import threading
from pathlib import Path

_pending: queue.SimpleQueue[Path] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _drain() -> None:
    while True:
        shutil.rmtree(_pending.get(), ignore_errors=True)


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
    _pending.put(trash)
