"""A data dir's work root belongs to one node process at a time.

An executor empties its work root when it starts and, as it runs, kills every sandbox on it
whose run it does not hold. Two `floom serve` processes on one data dir (a second terminal,
another port) would delete each other's work dirs and kill each other's runs as orphans,
one run in a few hundred, with nothing but an exit code 137 to show for it. So the executor
holds an exclusive lock on a file in the data dir for as long as it runs, and a second one
is refused at start with the pid of the first.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from floom.errors import DataDirInUse

LOCK_NAME = "node.lock"

_held: dict[str, int] = {}
_held_lock = threading.Lock()


def hold_work_root(data_dir: Path) -> None:
    """Take `data_dir`'s node lock for this process, or raise DataDirInUse naming the
    process that holds it. Taking it again in the same process is a no-op."""
    path = os.path.realpath(data_dir / LOCK_NAME)
    with _held_lock:
        if path in _held:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise DataDirInUse(
                f"another floom node{f' (pid {holder})' if holder.isdigit() else ''} runs "
                f"its sandboxes from the data dir {data_dir}",
                hint="stop that node first, or give this one a data dir of its own "
                "(FLOOM_DATA_DIR); nodes share work through the database, never a data dir",
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[path] = fd


def release_work_root(data_dir: Path) -> None:
    """Give the lock back (the executor stopped); closing the file releases it."""
    path = os.path.realpath(data_dir / LOCK_NAME)
    with _held_lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)
