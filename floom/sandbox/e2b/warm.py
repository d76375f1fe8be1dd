"""E2B warm starts (FLOOM_E2B_WARM; docs/how-to/warm-starts.md): sandboxes created ahead of
runs, per template and network shape, each handed to exactly one run and killed after it.

A pool starts with the first run that asks for its template and shape (that run creates its
own sandbox, as without warm starts: a miss); from then on a thread keeps FLOOM_E2B_WARM
sandboxes ready for it, creating one in the background for each handed out, within a
node-wide budget of ready sandboxes. A ready sandbox holds nothing of any run (no secret,
input, file or environment variable): only metadata naming the node and this process's pool
token, so that the orphan reaper kills what a dead process left and never what a live one
keeps. At hand-out it is checked (its envd answers, E2B moves its timeout to the run's);
one that fails is killed and the next one tried, and a run that finds none ready creates
its own, as before. A sandbox never serves a second run: the run's session kills it. A pool
unused for FLOOM_E2B_WARM_IDLE_SECONDS is emptied, a ready sandbox that old is replaced,
and `close` kills every ready one.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from e2b import Sandbox as E2BBox

log = logging.getLogger("floom.sandbox.e2b")

POOL_LABEL: Final = "floom_pool"
"""The metadata key naming the pool token of the process that created a ready sandbox."""
TIMEOUT_SLACK_SECONDS: Final = 60
"""A ready sandbox's E2B timeout past its idle time: E2B ends it even if floom cannot."""
CHECK_TIMEOUT: Final = 3.0
"""The longest a hand-out's check of a ready sandbox may take, per request."""
RETRY_MAX_SECONDS: Final = 60.0
"""The longest a pool waits before creating again after failures in a row."""
MAX_CHECKS: Final = 2
"""Ready sandboxes one hand-out may check before the run creates its own."""
CLOSE_WAIT_SECONDS: Final = 10.0
MAX_LET_GO: Final = 1000


@dataclass(frozen=True)
class E2BWarmSettings:
    """The node's FLOOM_E2B_WARM* settings."""

    count: int = 0
    """Ready sandboxes kept per template and shape; 0: E2B warm starts off."""
    idle_seconds: float = 300.0
    """A pool unused this long is emptied; a ready sandbox this old is replaced."""
    budget: int = 8
    """Ready sandboxes (and those being created for a pool) node-wide at most."""


@dataclass(frozen=True)
class BoxShape:
    """What a ready sandbox can serve: runs of one template, network on or off, on one
    node (named in its metadata for the reaper)."""

    template: str
    network: bool
    node: str


@dataclass(frozen=True)
class ReadyBox:
    box: E2BBox
    made: float


@dataclass(eq=False)
class BoxPool:
    shape: BoxShape
    ready: collections.deque[ReadyBox] = field(default_factory=collections.deque)
    creating: int = 0
    running: int = 0
    hits: int = 0
    misses: int = 0
    replaced: int = 0
    created: int = 0
    failures: int = 0
    retry_at: float = 0.0
    last_used: float = field(default_factory=time.monotonic)


Create = Callable[[BoxShape, int, dict[str, str]], E2BBox]
"""Creates a sandbox of a shape with an E2B timeout (seconds) and metadata."""
Kill = Callable[[E2BBox], bool]
"""Kills a sandbox; False (or an exception) when E2B could not be told."""


class WarmBoxes:
    """The E2B backend's warm pools, kept by a thread of their own; see the module."""

    def __init__(self, settings: E2BWarmSettings, *, create: Create, kill: Kill) -> None:
        self.settings = settings
        self._create = create
        self._kill = kill
        self.token = secrets.token_hex(8)
        self._pools: dict[BoxShape, BoxPool] = {}
        self._serving: dict[str, BoxPool] = {}
        # Sandboxes of this process whose kill failed: the reaper's, like any orphan.
        self._let_go: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The node's hits and misses since it started: a pool's own go with it when it is
        # idle long enough to be dropped, and a counter never goes back.
        self._hits = 0
        self._misses = 0

    # -- what runs ask ---------------------------------------------------------------------

    def take(self, shape: BoxShape, *, timeout: int) -> E2BBox | None:
        """A ready sandbox of `shape`, checked and its E2B timeout set to `timeout` seconds,
        handed to the calling run alone (a hit); None when none is ready (a miss: the run
        creates its own). Starts `shape`'s pool on first use."""
        with self._changed:
            if self._closed:
                return None
            pool = self._pools.get(shape)
            if pool is None:
                pool = self._pools[shape] = BoxPool(shape)
            pool.last_used = time.monotonic()
        for _ in range(MAX_CHECKS):
            with self._changed:
                if not pool.ready or self._closed:
                    pool.misses += 1
                    self._misses += 1
                    self._wake()
                    return None
                ready = pool.ready.popleft()
                pool.running += 1  # counted before the check: the refill sees the demand
                self._wake()
            if self._fits(ready.box, timeout):
                with self._changed:
                    pool.hits += 1
                    self._hits += 1
                    self._serving[ready.box.sandbox_id] = pool
                return ready.box
            with self._changed:
                pool.running -= 1
                pool.replaced += 1
            self._kill_later([ready.box])
        with self._changed:
            pool.misses += 1  # E2B failing the checks: the run creates its own, no later
        return None

    def done(self, box: E2BBox, *, killed: bool) -> None:
        """The run that `take` handed `box` to has ended and tried to kill it."""
        with self._changed:
            pool = self._serving.pop(box.sandbox_id, None)
            if pool is not None:
                pool.running = max(0, pool.running - 1)
                pool.last_used = time.monotonic()
            if not killed:
                self._remember_let_go(box.sandbox_id)

    def keeps(self, sandbox_id: str, metadata: dict[str, str]) -> bool:
        """Whether a sandbox E2B lists with `metadata` is one this process keeps (ready,
        being handed out or serving a run); any other pool's sandbox is an orphan."""
        with self._changed:
            return (
                metadata.get(POOL_LABEL) == self.token
                and not self._closed
                and sandbox_id not in self._let_go
            )

    # -- for /healthz, metrics, tests and the bench ----------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._changed:
            pools = [
                {
                    "template": pool.shape.template,
                    "network": pool.shape.network,
                    "ready": len(pool.ready),
                    "creating": pool.creating,
                    "running": pool.running,
                    "hits": pool.hits,
                    "misses": pool.misses,
                    "replaced": pool.replaced,
                }
                for pool in self._pools.values()
            ]
            hits, misses = self._hits, self._misses
        return {
            "enabled": True,
            "count": self.settings.count,
            "budget": self.settings.budget,
            "idle_seconds": self.settings.idle_seconds,
            "hits": hits,
            "misses": misses,
            "pools": pools,
        }

    def start(self, shape: BoxShape) -> None:
        """Start `shape`'s pool before any run asks for it (tests, the bench)."""
        with self._changed:
            if not self._closed and shape not in self._pools:
                self._pools[shape] = BoxPool(shape)
            self._wake()

    def wait_ready(
        self,
        template: str,
        *,
        network: bool | None = None,
        count: int = 1,
        timeout: float = 30.0,
    ) -> bool:
        """Wait until a pool of `template` (and `network`, if given) has `count` sandboxes
        ready (tests, the bench)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if any(
                    s.template == template
                    and network in (None, s.network)
                    and len(p.ready) >= count
                    for s, p in self._pools.items()
                ):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.05))

    def close(self) -> None:
        """Kill every ready sandbox (waiting a little for those being created); later runs
        create their own. Sandboxes serving runs are their sessions' to kill."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            deadline = time.monotonic() + CLOSE_WAIT_SECONDS
            while any(p.creating for p in self._pools.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.05))
            boxes = [r.box for p in self._pools.values() for r in p.ready]
            for pool in self._pools.values():
                pool.ready.clear()
        killers = [self._kill_later([box]) for box in boxes]
        for killer in killers:
            killer.join(timeout=CLOSE_WAIT_SECONDS)

    # -- the thread -------------------------------------------------------------------------

    def _fits(self, box: E2BBox, timeout: int) -> bool:
        """The hand-out's check: envd answers and E2B takes the run's timeout (both asked
        at once: the run waits for one round trip)."""
        failed: list[BaseException] = []

        def set_timeout() -> None:
            try:
                box.set_timeout(timeout, request_timeout=CHECK_TIMEOUT)
            except Exception as exc:
                failed.append(exc)

        setter = threading.Thread(target=set_timeout, name="floom-e2b-timeout", daemon=True)
        setter.start()
        try:
            running = box.is_running(request_timeout=CHECK_TIMEOUT)
        except Exception as exc:
            running, failed = False, [*failed, exc]
        setter.join(timeout=CHECK_TIMEOUT + 1)
        if running and not failed and not setter.is_alive():
            return True
        log.info(
            "a ready E2B sandbox failed its check and is replaced: %s",
            failed[0] if failed else "its envd does not answer",
        )
        return False

    def _wake(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._keep, name="floom-e2b-warm", daemon=True)
            self._thread.start()
        self._changed.notify_all()

    def _keep(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                stale = self._upkeep()
                wait = self._until_next_change() if not stale else 0.0
                if wait > 0:
                    self._changed.wait(wait)
            if stale:
                self._kill_later(stale)

    def _upkeep(self) -> list[E2BBox]:
        """Under the lock: drop idle pools and old sandboxes (returned, to kill), and start
        the creations the pools need within the budget."""
        now = time.monotonic()
        settings = self.settings
        stale: list[E2BBox] = []
        for shape, pool in list(self._pools.items()):
            if (
                pool.running == 0
                and pool.creating == 0
                and now - pool.last_used > (settings.idle_seconds)
            ):
                del self._pools[shape]
                stale += [r.box for r in pool.ready]
                continue
            while pool.ready and now - pool.ready[0].made > settings.idle_seconds:
                stale.append(pool.ready.popleft().box)
        held = sum(len(p.ready) + p.creating for p in self._pools.values())
        for pool in self._pools.values():
            if now - pool.last_used > settings.idle_seconds:
                continue  # idle: not refilled, emptied once its runs end
            while (
                len(pool.ready) + pool.creating < settings.count
                and held < settings.budget
                and now >= pool.retry_at
            ):
                pool.creating += 1
                held += 1
                threading.Thread(
                    target=self._create_one, args=(pool,), name="floom-e2b-create", daemon=True
                ).start()
        return stale

    def _until_next_change(self) -> float:
        now = time.monotonic()
        idle = self.settings.idle_seconds
        moments = [now + 60.0]
        for pool in self._pools.values():
            moments.append(pool.last_used + idle)
            moments += [r.made + idle for r in pool.ready]
            if pool.retry_at > now:
                moments.append(pool.retry_at)
        return max(0.01, min(moments) - now)

    def _create_one(self, pool: BoxPool) -> None:
        shape = pool.shape
        timeout = math.ceil(self.settings.idle_seconds) + TIMEOUT_SLACK_SECONDS
        try:
            box = self._create(shape, timeout, {"floom_node": shape.node, POOL_LABEL: self.token})
        except Exception as exc:  # E2B failing: runs create their own meanwhile
            with self._changed:
                pool.creating -= 1
                pool.failures += 1
                pool.retry_at = time.monotonic() + min(
                    RETRY_MAX_SECONDS, 0.5 * 2 ** min(pool.failures, 10)
                )
                self._changed.notify_all()
                first = pool.failures == 1
            (log.warning if first else log.debug)(
                "could not create a ready E2B sandbox of template %r (runs create their own "
                "meanwhile): %s",
                shape.template,
                exc,
            )
            return
        with self._changed:
            pool.creating -= 1
            pool.failures = 0
            pool.retry_at = 0.0
            keep = not self._closed and self._pools.get(shape) is pool
            if keep:
                pool.created += 1
                pool.ready.append(ReadyBox(box, time.monotonic()))
            self._changed.notify_all()
        if not keep:
            self._kill_later([box])

    def _kill_later(self, boxes: list[E2BBox]) -> threading.Thread:
        """Kill `boxes` on a thread of their own (E2B may be slow or away)."""

        def kill() -> None:
            for box in boxes:
                killed = False
                try:
                    killed = bool(self._kill(box))
                except Exception as exc:  # E2B ends it at its timeout; the reaper retries
                    log.warning("could not kill a ready E2B sandbox %s: %s", box.sandbox_id, exc)
                if not killed:
                    with self._changed:
                        self._remember_let_go(box.sandbox_id)

        thread = threading.Thread(target=kill, name="floom-e2b-warm-kill", daemon=True)
        thread.start()
        return thread

    def _remember_let_go(self, sandbox_id: str) -> None:
        self._let_go[sandbox_id] = None
        while len(self._let_go) > MAX_LET_GO:
            self._let_go.popitem(last=False)
