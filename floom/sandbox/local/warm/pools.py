"""The node's warm pools: per worker version (and interpreter) a warm process and children
prepared ahead of runs, sized by demand, recycled after a number of runs or seconds, ended
when idle, and all within a node-wide memory budget.

A pool starts from what a cold run of its version loaded (`record_command` makes the cold
run write it, `read_record` reads it back, bounded and checked); until it has a warm child
ready, runs start cold. A run of another version of the same worker replaces the worker's
pool: a deploy or a rollback never runs on the warm process of the version before.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from floom.errors import FloomError
from floom.sandbox.base import SandboxSpec
from floom.sandbox.local import cgroups
from floom.sandbox.local.uid_pool import UidPool
from floom.sandbox.local.warm.inside import RECORD_NAME, preloadable
from floom.sandbox.local.warm.process import (
    INSIDE,
    INTERPRETER_FLAGS,
    WARM_ENV,
    WARM_MARK,
    Launching,
    PreparedChild,
    WarmProcess,
    end_closing,
)

log = logging.getLogger("floom.sandbox")

MODULE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,80}(\.[A-Za-z_][A-Za-z0-9_]{0,80}){0,8}")
MAX_MODULES: Final = 3000
MAX_RECORD_BYTES: Final = 256 * 1024
MAX_MODULES_ARG: Final = 120 * 1024
"""The preload list travels as one argument: below the kernel's 128 KiB for one."""
RECORD_TRIES: Final = 3
"""Cold runs that may try to record a version's modules before its pool starts without."""
START_FAILURES: Final = 3
"""Failed starts in a row after which a pool waits RETRY_SECONDS before trying again."""
RETRY_SECONDS: Final = 30.0
TAKE_WAIT_SECONDS: Final = 0.05
"""How long a run waits for a child its pool's warm process is preparing before it starts
cold (a cold start costs a hello run 20-30 ms more of CPU and wall time)."""
SUCCESSOR_LEAD: Final = 0.1
"""How early (a fraction of FLOOM_WARM_RECYCLE_RUNS or _SECONDS) a pool starts the warm
process that takes over from one due for recycling."""
MAX_CHILD_AGE_SECONDS: Final = 300.0
"""A prepared child waits at most this long (it holds a cgroup and namespaces)."""
DEMAND_WINDOW_SECONDS: Final = 60.0
IDLE_WAKE_SECONDS: Final = 60.0
"""The longest the pools' thread sleeps with nothing due (a warm process that died is also
noticed by the next run, which wakes it)."""
JOIN_SECONDS: Final = 40.0
"""How long closing waits for the pools' threads: past the longest a start is awaited."""
WATCH_SECONDS: Final = 5.0
"""How often the thread looks whether a pool's warm process died, while there is one."""


@dataclass(frozen=True)
class WarmSettings:
    """The node's FLOOM_WARM_* settings (README: Warm starts)."""

    enabled: bool = True
    ready: int = 4
    """Children kept prepared per pool at most; demand decides how many up to it."""
    recycle_runs: int = 200
    recycle_seconds: float = 600.0
    idle_seconds: float = 300.0
    memory_mb: int = 1024
    """What all warm processes of the node may hold resident together."""


@dataclass(frozen=True)
class WarmKey:
    """What a warm process may serve: one version of one worker, run by one interpreter."""

    version: str
    interpreter: str


@dataclass(eq=False)
class Pool:
    key: WarmKey
    owner: str
    modules: tuple[str, ...]
    marker: str
    process: WarmProcess | None = None
    # The warm process that takes over once `process` is due for recycling, started ahead
    # by a thread of its own (`starting`) so that runs never wait for a start.
    successor: WarmProcess | None = None
    starting: bool = False
    ready: collections.deque[PreparedChild] = field(default_factory=collections.deque)
    hits: int = 0
    misses: int = 0
    in_flight: int = 0
    peak: int = 1
    peak_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    failures: int = 0
    retry_at: float = 0.0
    refused: set[str] = field(default_factory=set)
    retired: bool = False
    processes_started: int = 0
    # The memory limit of the version's runs (its manifest's): children are prepared with
    # their /tmp and /dev/shm of that size mounted ahead (0: unknown yet).
    memory_bytes: int = 0

    def target(self, settings: WarmSettings) -> int:
        # One more than the runs at once: the next run finds one while its own is replaced.
        return max(1, min(settings.ready, self.peak + 1))


class WarmPools:
    """Every warm pool of one local sandbox, kept by a thread of its own."""

    def __init__(
        self,
        settings: WarmSettings,
        *,
        system_args: Callable[[], tuple[str, ...]],
        uids: UidPool,
        source: str | None = None,
    ) -> None:
        """`uids`: the sandbox uid pool, whose uids the warm processes' user namespaces map
        (each the root of its own, leased from it, and the runs'). `source`: what warm
        processes run (inside.py's source; tests add to it)."""
        self.settings = settings
        self._uids = uids
        self._system_args = system_args
        self._source = source if source is not None else INSIDE.read_text()
        self._token = secrets.token_hex(6)
        self._pools: dict[WarmKey, Pool] = {}
        self._owners: dict[str, WarmKey] = {}
        self._records: dict[WarmKey, tuple[str, ...]] = {}
        self._record_tries: dict[WarmKey, int] = {}
        self._recording: set[WarmKey] = set()
        # The node's hits and misses since it started: a pool's own go with it (a deploy,
        # idleness or the memory budget ends pools), and a counter never goes back.
        self._hits = 0
        self._misses = 0
        self._pending: collections.deque[Callable[[], None]] = collections.deque()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # Warm processes started and not ready yet, and the threads awaiting successors:
        # `close` ends the one and waits for the other, so nothing outlives it.
        self._launching: set[Launching] = set()
        self._awaiting: set[threading.Thread] = set()
        self._closed = False
        self._interpreter: tuple[float, str] = (0.0, "")

    # -- what runs ask ---------------------------------------------------------------------

    def key_of(self, spec: SandboxSpec) -> WarmKey | None:
        """The pool `spec` may start from, or None: not opted in, warm starts off, not a
        Python script, or with network (warm runs have none)."""
        if not (self.settings.enabled and spec.warm) or self._closed:
            return None
        command = spec.command
        if len(command) < 2 or command[0] != "python3" or not command[1].endswith(".py"):
            return None
        if spec.network or not cgroups.detect().enforced:
            return None
        interpreter = self._interpreter_id()
        return WarmKey(spec.warm, interpreter) if interpreter else None

    def take(
        self, key: WarmKey, *, owner: str, work_root: Path, memory_bytes: int = 0
    ) -> PreparedChild | None:
        """A prepared child of `key`'s pool (a hit), or None (a miss: the run starts cold).
        A run of another version than its worker's pool replaces that pool. `memory_bytes`:
        the run's memory limit, which the pool's next children are prepared for."""
        taken: PreparedChild | None = None
        with self._changed:
            self._replace_owner(owner, key)
            pool = self._pools.get(key)
            if pool is None and key in self._records:
                pool = self._new_pool(key, owner, self._records[key], work_root)
            if pool is None:
                self._misses += 1
                return None
            if memory_bytes:
                pool.memory_bytes = memory_bytes
            now = time.monotonic()
            pool.last_used = now
            pool.in_flight += 1
            if pool.in_flight > pool.peak or now - pool.peak_at > DEMAND_WINDOW_SECONDS:
                pool.peak, pool.peak_at = pool.in_flight, now
            deadline = now + TAKE_WAIT_SECONDS
            while taken is None:
                while pool.ready and taken is None:
                    child = pool.ready.popleft()
                    # A child lives on without its warm process: it holds all its run needs.
                    if child.alive():
                        taken = child
                    else:
                        self._later(child.discard)
                # None ready, but a live warm process is making more (more runs came at
                # once than were prepared): a moment's wait costs less than a cold start.
                left = deadline - time.monotonic()
                process = pool.process
                if taken is not None or left <= 0 or self._closed or pool.retired:
                    break
                if process is None or not process.alive() or self._pools.get(key) is not pool:
                    break
                self._wake()
                self._changed.wait(left)
            if taken is None:
                pool.misses += 1
                self._misses += 1
                pool.in_flight -= 1  # counted for the demand only: it runs cold
            else:
                pool.hits += 1
                self._hits += 1
            self._wake()
        return taken

    def finished(self, key: WarmKey) -> None:
        """A run that `take` counted has ended."""
        with self._changed:
            pool = self._pools.get(key)
            if pool is not None:
                pool.in_flight = max(0, pool.in_flight - 1)
                pool.last_used = time.monotonic()

    def wants_record(self, key: WarmKey) -> bool:
        """Whether a cold run of `key` should record what it loads (then `recorded`)."""
        with self._changed:
            if key in self._records or key in self._recording:
                return False
            if self._record_tries.get(key, 0) >= RECORD_TRIES:
                self._records[key] = ()  # a pool without preloads still saves the start
                return False
            self._recording.add(key)
            self._record_tries[key] = self._record_tries.get(key, 0) + 1
            return True

    def recorded(
        self, key: WarmKey, modules: tuple[str, ...] | None, *, owner: str, work_root: Path
    ) -> None:
        """What a recording cold run loaded (None: it left no record); starts the pool."""
        with self._changed:
            self._recording.discard(key)
            if modules is None or self._closed:
                return
            self._records[key] = modules
            self._replace_owner(owner, key)
            if key not in self._pools:
                self._new_pool(key, owner, modules, work_root)
            self._wake()

    def command_to_record(self, command: list[str]) -> list[str]:
        """The cold command that runs `command` (python3 SCRIPT ...) and records."""
        return [command[0], *INTERPRETER_FLAGS, "-c", self._source, "record", *command[1:]]

    # -- for /healthz, metrics, tests and the reaper ---------------------------------------

    def stats(self) -> dict[str, object]:
        with self._changed:
            pools = [
                {
                    "version": pool.key.version,
                    "worker": pool.owner,
                    "ready": len(pool.ready),
                    "running": pool.in_flight,
                    "hits": pool.hits,
                    "misses": pool.misses,
                    "modules": len(pool.modules),
                    "warm_processes_started": pool.processes_started,
                    "rss_bytes": pool.process.rss_bytes() if pool.process else 0,
                }
                for pool in self._pools.values()
            ]
            return {
                "enabled": self.settings.enabled,
                "pools": pools,
                "hits": self._hits,
                "misses": self._misses,
            }

    def wait_ready(self, key: WarmKey, timeout: float) -> bool:
        """Wait until `key`'s pool has a child ready (tests and the bench)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                pool = self._pools.get(key)
                process = pool.process if pool is not None else None
                if pool and process and process.alive() and any(c.alive() for c in pool.ready):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake()  # a warm process that died is replaced now
                self._changed.wait(min(left, 0.05))

    def process_of(self, key: WarmKey) -> WarmProcess | None:
        with self._changed:
            pool = self._pools.get(key)
            return pool.process if pool else None

    @property
    def token(self) -> str:
        """What ends the markers of this instance's warm processes."""
        return self._token

    def close(self) -> None:
        """End every pool, and every warm process on its way, before returning (each
        reaped and its uid given back); later runs start cold."""
        with self._changed:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
            launching = list(self._launching)
            thread = self._thread
            self._changed.notify_all()
        for started in launching:
            started.abort()
        for pool in pools:
            _end_pool(pool, now=True)
        # The pools' thread ends once its work in hand has (a start it makes now is aborted
        # as it is made); then no thread awaiting a successor is added.
        _join(thread)
        with self._changed:
            awaiting = list(self._awaiting)
        for waiter in awaiting:
            _join(waiter)
        end_closing(self._token)

    # -- the thread -------------------------------------------------------------------------

    def _new_pool(
        self, key: WarmKey, owner: str, modules: tuple[str, ...], work_root: Path
    ) -> Pool:
        pool = Pool(key, owner, modules, marker=f"{warm_prefix(work_root)}{self._token}")
        self._pools[key] = pool
        self._owners[owner] = key
        return pool

    def _replace_owner(self, owner: str, key: WarmKey) -> None:
        old = self._owners.get(owner)
        if old is not None and old != key:
            pool = self._pools.pop(old, None)
            if pool is not None:
                pool.retired = True
                self._later(lambda: _end_pool(pool))
        self._owners[owner] = key

    def _later(self, action: Callable[[], None]) -> None:
        """Run `action` on the pools' thread (under the lock)."""
        self._pending.append(action)
        self._wake()

    def _wake(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._keep, name="floom-warm-pools", daemon=True)
            self._thread.start()
        self._changed.notify_all()

    def _keep(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                actions = list(self._pending)
                self._pending.clear()
                work = None if actions else self._next_work()
                if work is None and not actions:
                    self._changed.wait(self._until_next_change())
                    continue
            for action in actions:
                try:
                    action()
                except Exception:
                    log.exception("warm pool clean-up failed")
            if work is not None:
                try:
                    work()
                except Exception:
                    log.exception("warm pool upkeep failed")

    def _next_work(self) -> Callable[[], None] | None:
        """The next thing a pool needs (under the lock), or None."""
        now = time.monotonic()
        settings = self.settings
        for key, pool in list(self._pools.items()):
            if pool.in_flight == 0 and now - pool.last_used > settings.idle_seconds:
                del self._pools[key]
                if self._owners.get(pool.owner) == key:
                    del self._owners[pool.owner]
                return functools.partial(_end_pool, pool)
            stale = [c for c in pool.ready if now - c.made > MAX_CHILD_AGE_SECONDS]
            if stale:
                for child in stale:
                    pool.ready.remove(child)
                return functools.partial(_end_process, None, stale)
            process = pool.process
            if process is not None and not process.alive():
                pool.process, pool.successor = pool.successor, None
                children, pool.ready = list(pool.ready), collections.deque()
                return functools.partial(_end_process, process, children)
            if process is not None and _used_up(process, settings, now, lead=0.0):
                if pool.starting and pool.successor is None:
                    continue  # it prepares no more; its successor is on its way
                # Its children prepared already stay: they count in its runs.
                pool.process, pool.successor = pool.successor, None
                return functools.partial(_end_process, process, [])
            if (
                process is not None
                and pool.successor is None
                and not pool.starting
                and _used_up(process, settings, now, lead=SUCCESSOR_LEAD)
                and self._within_budget(pool)
            ):
                pool.starting = True
                return functools.partial(self._start_successor, pool)
            if pool.process is None:
                if now < pool.retry_at:
                    continue
                if not self._within_budget(pool):
                    continue
                return functools.partial(self._start, pool)
            if len(pool.ready) < pool.target(settings):
                # Never more children of one warm process than FLOOM_WARM_RECYCLE_RUNS.
                left = settings.recycle_runs - pool.process.served
                wanted = min(pool.target(settings) - len(pool.ready), left)
                return functools.partial(self._prepare, pool, wanted)
        return None

    def _until_next_change(self) -> float:
        """Seconds until a pool goes idle, a warm process is due for recycling, a child
        grows stale or a failed start may be tried again (under the lock): an idle node's
        thread sleeps until then, or until a run wakes it."""
        now = time.monotonic()
        settings = self.settings
        moments = [now + IDLE_WAKE_SECONDS]
        for pool in self._pools.values():
            moments.append(pool.last_used + settings.idle_seconds)
            if pool.process is not None:
                moments.append(pool.process.started + settings.recycle_seconds)
                lead = settings.recycle_seconds * SUCCESSOR_LEAD
                moments.append(pool.process.started + settings.recycle_seconds - lead)
                moments.append(now + WATCH_SECONDS)  # whether it died
            moments += [child.made + MAX_CHILD_AGE_SECONDS for child in pool.ready]
            if pool.process is None:
                moments.append(max(pool.retry_at, now + 0.05))
        return max(0.0, min(moments) - now)

    def _within_budget(self, starting: Pool) -> bool:
        """Whether another warm process fits the memory budget; else the least recently
        used idle pool makes room, if there is one."""
        budget = self.settings.memory_mb * 1024 * 1024
        running = [p for p in self._pools.values() if p.process is not None]
        used = sum(p.process.rss_bytes() for p in running if p.process is not None)
        average = used // len(running) if running else 0
        if used + max(average, 16 << 20) <= budget:
            return True
        idle = [p for p in running if p.in_flight == 0 and p is not starting]
        if not idle:
            return False
        victim = min(idle, key=lambda p: p.last_used)
        del self._pools[victim.key]
        if self._owners.get(victim.owner) == victim.key:
            del self._owners[victim.owner]
        self._later(lambda: _end_pool(victim))
        return False

    def _start(self, pool: Pool) -> None:
        try:
            process = self._awaited(self._launch(pool))
        except FloomError as exc:
            if self._closed:
                return
            refused = (exc.details or {}).get("refused") if isinstance(exc.details, dict) else None
            with self._changed:
                if refused:
                    pool.refused.add(str(refused).split(".")[0])
                else:
                    pool.failures += 1
                    if pool.failures >= START_FAILURES:
                        pool.retry_at = time.monotonic() + RETRY_SECONDS
                        pool.failures = 0
                    log.warning("a warm process did not start: %s", exc.message)
            return
        with self._changed:
            if pool.retired or self._closed or self._pools.get(pool.key) is not pool:
                process.close()
                return
            pool.process = process
            pool.failures = 0
            pool.processes_started += 1
            self._changed.notify_all()

    def _start_successor(self, pool: Pool) -> None:
        """Start the warm process that takes over from `pool`'s once that one is used up:
        launched from this thread, which outlives it, and awaited by another, while this one
        goes on preparing children of the current one."""
        try:
            launching = self._launch(pool)
        except FloomError as exc:
            log.warning("a warm process did not start: %s", exc.message)
            with self._changed:
                pool.starting = False
            return
        waiter = threading.Thread(
            target=self._await_successor,
            args=(pool, launching),
            name="floom-warm-start",
            daemon=True,
        )
        with self._changed:
            self._awaiting.add(waiter)
        waiter.start()

    def _await_successor(self, pool: Pool, launching: Launching) -> None:
        process: WarmProcess | None = None
        try:
            process = self._awaited(launching)
        except FloomError as exc:
            if not self._closed:
                log.warning("a warm process did not start: %s", exc.message)
        with self._changed:
            self._awaiting.discard(threading.current_thread())
            pool.starting = False
            wanted = not pool.retired and not self._closed and pool.successor is None
            if process is not None and wanted and self._pools.get(pool.key) is pool:
                pool.successor, process = process, None
                pool.processes_started += 1
            self._changed.notify_all()
        if process is not None:
            process.close()

    def _launch(self, pool: Pool) -> Launching:
        """Start `pool`'s next warm process; `_awaited` waits for it (once `close` has begun,
        it is aborted as soon as it is made)."""
        modules = tuple(m for m in pool.modules if m.split(".")[0] not in pool.refused)
        launching = WarmProcess.launch(
            modules=_fit(modules),
            owner=pool.marker,
            system_args=self._system_args(),
            source=self._source,
            uids=self._uids,
        )
        with self._changed:
            self._launching.add(launching)
            closed = self._closed
        if closed:
            launching.abort()
        return launching

    def _awaited(self, launching: Launching) -> WarmProcess:
        """`launching`'s warm process once ready (see Launching.ready)."""
        try:
            return launching.ready()
        finally:
            with self._changed:
                self._launching.discard(launching)

    def _prepare(self, pool: Pool, count: int) -> None:
        process = pool.process
        if process is None:
            return

        def publish(child: PreparedChild) -> None:
            # Each child to the runs as soon as it is ready, not once all `count` are.
            with self._changed:
                if pool.process is process and not pool.retired and not self._closed:
                    pool.ready.append(child)
                    self._changed.notify_all()
                    return
            child.discard()

        try:
            process.prepare(count, memory_bytes=pool.memory_bytes, each=publish)
        except (FloomError, OSError) as exc:
            log.warning("a warm process could not prepare a child: %s", exc)
            with self._changed:
                if pool.process is process:
                    pool.process = None
            process.close()

    def _interpreter_id(self) -> str:
        """The sandbox's python3: its real path and change time, looked up every 10 s."""
        checked, found = self._interpreter
        now = time.monotonic()
        if now - checked < 10.0:
            return found
        python = shutil.which("python3", path=WARM_ENV["PATH"])
        found = ""
        if python is not None:
            with contextlib.suppress(OSError):
                real = os.path.realpath(python)
                found = f"{real}@{os.stat(real).st_mtime_ns}"
        self._interpreter = (now, found)
        return found


def warm_prefix(work_root: Path) -> str:
    """How the markers of warm processes serving runs on `work_root` start (the token of
    the sandbox instance that started them follows)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(work_root))).hexdigest()[:24]
    return f"{WARM_MARK}{digest}:"


def _join(thread: threading.Thread | None) -> None:
    """Wait for `thread` (a start it awaits ends within START_SECONDS at worst)."""
    if thread is None or thread is threading.current_thread():
        return
    thread.join(JOIN_SECONDS)
    if thread.is_alive():
        log.warning("the warm pools' thread %s did not end within %g s", thread.name, JOIN_SECONDS)


def _end_pool(pool: Pool, *, now: bool = False) -> None:
    """End `pool`'s processes: `now`, at once (the node stops), else each once its runs in
    flight have ended."""
    process, pool.process = pool.process, None
    successor, pool.successor = pool.successor, None
    children, pool.ready = list(pool.ready), collections.deque()
    _end_process(process, children, now=now)
    if successor is not None:
        successor.close(now=now)


def _used_up(process: WarmProcess, settings: WarmSettings, now: float, *, lead: float) -> bool:
    """Whether `process` has prepared its FLOOM_WARM_RECYCLE_RUNS children or lived its
    FLOOM_WARM_RECYCLE_SECONDS, less the fraction `lead` of each."""
    runs = settings.recycle_runs - (max(1, int(settings.recycle_runs * lead)) if lead else 0)
    seconds = settings.recycle_seconds * (1.0 - lead)
    return process.served >= runs or now - process.started >= seconds


def _end_process(
    process: WarmProcess | None, children: list[PreparedChild], *, now: bool = False
) -> None:
    for child in children:
        child.discard()
    if process is not None:
        process.close(now=now)


def _fit(modules: tuple[str, ...]) -> tuple[str, ...]:
    kept: list[str] = []
    size = 0
    for name in modules:
        size += len(name) + 1
        if size > MAX_MODULES_ARG:
            break
        kept.append(name)
    return tuple(kept)


def read_record(workdir: Path) -> tuple[str, ...] | None:
    """The modules a recording run wrote (RECORD_NAME in its work dir), checked: module
    names only, none that acts when imported, at most MAX_MODULES; the file is removed.
    None when there is no record a regular file could hold."""
    path = workdir / RECORD_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_size > MAX_RECORD_BYTES:
            return None
        data = os.read(fd, MAX_RECORD_BYTES + 1)[:MAX_RECORD_BYTES]
    except OSError:
        return None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    names = []
    for line in data.decode("ascii", "replace").splitlines():
        name = line.strip()
        if MODULE_NAME.fullmatch(name) and preloadable(name):
            names.append(name)
        if len(names) >= MAX_MODULES:
            break
    return tuple(names)
