"""Cleaning up after runs off their path: work dirs removed in the background (deleting a
tree costs milliseconds that an executor slot should spend on the next run), and sandboxes
left running by a node that died, reaped through each backend.

A work dir holds whatever its run left: links to anywhere, FIFOs, unreadable folders, trees
thousands of folders deep (shutil.rmtree recurses: its RecursionError ended the cleanup thread
for good, and kept a server from starting over such a leftover). `remove_trees` deletes such a
tree whole without following a link: with one `rm` process for a batch of trees, which also
keeps the thousands of system calls of a burst's removals from trading the GIL with the
threads that serve runs (bench/README.md), then, for anything left, in Python without
recursion.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Final

from floom.sandbox.base import Sandbox
from floom.sandbox.local.disks import unmount_under

log = logging.getLogger("floom.cleanup")

# How long a discarded work dir waits before it is deleted. A run's end is recorded just
# before its work dir is discarded, and its waiter then reads and answers on other threads:
# deleting the tree at once made this thread hold the GIL right when they needed it (each
# of the few dozen system calls of a removal hands the GIL back and forth), which delayed
# the answer by milliseconds. A moment later the answer has gone out.
DELAY_SECONDS = 0.1

# The most trees the cleanup thread removes at once: a burst's discarded work dirs.
MAX_BATCH: Final = 64
# The most paths one `rm` is given, well within any argv limit (a work root left full).
RM_ARGUMENTS: Final = 512
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_pending: queue.SimpleQueue[tuple[float, Path]] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _drain() -> None:
    while True:
        due, path = _pending.get()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        # With those discarded meanwhile, due within DELAY_SECONDS of it.
        batch = [path]
        while len(batch) < MAX_BATCH:
            try:
                batch.append(_pending.get_nowait()[1])
            except queue.Empty:
                break
        try:
            remove_trees(batch)
        except Exception:  # the thread must outlive any tree; the next start empties the root
            log.exception("removing %d discarded work dir(s) failed", len(batch))


def remove_trees(paths: Sequence[Path]) -> None:
    """Delete each of `paths` with all it holds, without following a link and at any depth;
    what another filesystem has mounted below one is left alone."""
    # A run dir that had a disk of its own is an empty folder once the disk is unmounted:
    # removed here, without starting `rm` (a fork and an exec from this large process).
    paths = [path for path in paths if not _removed_empty(path)]
    rm = _rm()
    for start in range(0, len(paths), RM_ARGUMENTS):
        if rm is None:
            break
        some = [os.fspath(path) for path in paths[start : start + RM_ARGUMENTS]]
        try:
            subprocess.run(
                [rm, "-rf", "--one-file-system", "--", *some],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={},
                check=False,
            )
        except OSError as exc:  # out of processes or memory: the slow way below
            log.debug("rm could not start: %s", exc)
    for path in paths:
        if os.path.lexists(path):
            _remove_flat(path)


def empty_folder(folder: Path) -> None:
    """Delete everything in `folder`, which stays (a link to a folder too: what it points
    at is emptied, as an operator who put the work root on another disk expects). What is
    mounted below it (the disks of runs a killed process left, floom/sandbox/local/disks.py) is
    unmounted first, so that their images go too."""
    unmount_under(folder)
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    remove_trees([folder / name for name in names])


def _removed_empty(path: Path) -> bool:
    """Whether `path` was an empty folder (not a link to one) and is now removed."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


@functools.cache
def _rm() -> str | None:
    return shutil.which("rm")


def _remove_flat(top: Path) -> None:
    """Delete the tree `top` in Python, with two descriptors and no recursion at any depth:
    a folder's subfolders are renamed up to sit directly under `top` before the folder is
    emptied and removed. Each folder is made the owner's to read first (a run under floom's
    own uid may have taken its rights on one away). What cannot go is left, said in the log."""
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            os.unlink(top)
            return
        os.chmod(top, 0o700)
        top_fd = os.open(top, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("could not remove %s: %s", top, exc)
        return
    try:
        left = _empty(top_fd)
    finally:
        os.close(top_fd)
    try:
        os.rmdir(top)
    except OSError as exc:
        log.warning("could not remove all of %s (%d entries left): %s", top, left, exc)


def _empty(top_fd: int) -> int:
    """Remove everything in the folder open as `top_fd`; returns how many entries stayed."""
    left = 0
    folders: list[str | None] = [None]  # None: the top itself; else a name directly in it
    moved = 0
    while folders:
        name = folders.pop()
        try:
            if name is not None:
                os.chmod(name, 0o700, dir_fd=top_fd)  # a folder: it was listed as one
                fd = os.open(name, _DIR_FLAGS, dir_fd=top_fd)
            else:
                fd = top_fd
        except OSError:
            left += 1
            continue
        try:
            with os.scandir(fd) as entries:
                found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
            for entry, is_dir in found:
                if not is_dir:
                    left += _unlinked_not(entry, fd)
                elif name is None:
                    folders.append(entry)
                else:
                    while _exists(f".floom-rm-{moved}", top_fd):
                        moved += 1
                    up = f".floom-rm-{moved}"
                    try:
                        os.rename(entry, up, src_dir_fd=fd, dst_dir_fd=top_fd)
                    except OSError:
                        left += 1  # a mount point, most likely
                        continue
                    folders.append(up)
                    moved += 1
        finally:
            if fd != top_fd:
                os.close(fd)
        if name is not None:
            try:
                os.rmdir(name, dir_fd=top_fd)
            except OSError:
                left += 1
    return left


def _unlinked_not(name: str, dir_fd: int) -> int:
    """0 once `name` is gone, 1 when it could not be unlinked."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return 1
    return 0


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


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
