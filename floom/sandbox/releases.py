"""Releasing what a run held, off the path of the slot that ran it: its cgroup, its uid, its
run dir's disk. Once a run's result is read, its slot reports it and takes the next run at
once; one thread of the backend's (`Releases`) ends what is left of the run meanwhile.

Nothing a release frees is reused before it is done: a uid is given back only by the
release itself, after the run's cgroup is gone (its processes dead), and a run dir's path
is taken again only once its release is over (`wait_for`). Pending releases are bounded
(`room`): past it, and whenever the caller says so (`later=False`: the backend when its
uids run short), the caller releases its run itself, at once, as a slot did before; no
run ever waits for a release of another's. A backend's close drains its releases
(`drain`), so no process, zombie or mount of a run outlives it; a floom that died
mid-release leaves what the next start's reaper cleans up (kill_orphans, the work root
emptied).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger("floom.sandbox")

DELAY_SECONDS: Final = 0.05
"""How long a release waits before it runs: a run's end is recorded and answered just after
its release is added, and the release's system calls would trade the GIL with that."""
DRAIN_SECONDS: Final = 30.0
"""How long a backend's close waits for its pending releases: each is bounded (a cgroup's
kill waits 5 s at most), so this is reached only by a node that cannot end a run."""
ROOM: Final = 16
"""How many releases may be pending at once by default: each holds a cgroup, a mount or a
uid, so a release thread that falls behind (a slow unmount, a reporter that takes its
second) makes the slots release their own runs again rather than pile them up."""
IDLE_SECONDS: Final = 30.0
"""How long the thread waits for a release before it ends (the next `add` starts another):
a backend that runs nothing, or was dropped without `close`, keeps no thread."""


class Releases:
    """Release steps run in order on one thread of their own (started at first use), each
    optionally holding a path until it is done; at most `room` pending at once."""

    def __init__(
        self,
        name: str = "floom-releases",
        *,
        room: int = ROOM,
        delay: float = DELAY_SECONDS,
        idle: float = IDLE_SECONDS,
    ) -> None:
        self._name = name
        self._room = room
        self._delay = delay
        self._idle = idle
        self._changed = threading.Condition()
        # (when it is due, the release, the path it holds)
        self._pending: collections.deque[tuple[float, Callable[[], object], str | None]] = (
            collections.deque()
        )
        self._paths: collections.Counter[str] = collections.Counter()
        self._busy = 0
        # How many were added and how many are done: in order, so all of the first N are
        # done once N are.
        self._added = 0
        self._done = 0
        self._hurry = False  # someone waits for the releases: no delay until all are done
        self._thread: threading.Thread | None = None

    def add(
        self, release: Callable[[], object], *, path: Path | None = None, later: bool = True
    ) -> bool:
        """Have `release` run on the releases' thread, after those added before it; True
        when it was left to that thread. With `later` False, or `room` releases pending
        already, it runs now on the caller's thread instead, and False is returned.
        `path`: what it frees, taken again only once it returned (`wait_for`). A release
        that raises is logged; the next ones run all the same."""
        if later:
            key = None if path is None else os.path.abspath(path)
            with self._changed:
                if len(self._pending) + self._busy < self._room:
                    self._pending.append((time.monotonic() + self._delay, release, key))
                    self._added += 1
                    if key is not None:
                        self._paths[key] += 1
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._serve, name=self._name, daemon=True
                        )
                        self._thread.start()
                    elif len(self._pending) == 1:
                        # Else the thread is awake, or sleeps until an earlier one is due.
                        self._changed.notify_all()
                    return True
        try:
            release()
        except Exception:  # as on the thread: what failed stays held, the run goes on
            log.exception("releasing what a run held failed")
        return False

    def pending(self) -> int:
        """How many releases are waiting or running now."""
        with self._changed:
            return len(self._pending) + self._busy

    def wait_for(self, path: Path, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait until no release of `path` is pending; False when one still was after
        `timeout` seconds."""
        key = os.path.abspath(path)
        return self._wait(lambda: self._paths[key] == 0, timeout)

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait until every release added so far is done; False when some were not after
        `timeout` seconds."""
        with self._changed:
            added = self._added
        # Not until none is pending: other runs' releases may keep coming meanwhile.
        return self._wait(lambda: self._done >= added, timeout)

    def _wait(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            if not done():
                self._hurry = True
                self._changed.notify_all()
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _serve(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._pending:
                        self._hurry = False
                        if not self._changed.wait(self._idle) and not self._pending:
                            self._thread = None
                            return
                        continue
                    wait = self._pending[0][0] - time.monotonic()
                    if wait <= 0 or self._hurry:
                        break
                    self._changed.wait(wait)
                _, release, key = self._pending.popleft()
                self._busy += 1
            try:
                release()
            except BaseException:
                # The thread serves the backend's life: whatever one release raises
                # (SystemExit too) is logged and the next ones run; what it failed to free
                # stays held, the safe side.
                log.exception("releasing what a run held failed")
            finally:
                with self._changed:
                    self._busy -= 1
                    self._done += 1
                    if key is not None:
                        self._paths[key] -= 1
                        if self._paths[key] <= 0:
                            del self._paths[key]
                    self._changed.notify_all()
