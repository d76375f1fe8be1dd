"""Waiting for a run to end: the one mechanism behind REST `?wait=`, webhooks' `?wait`, the
`/mcp` tools, and (through `?wait=`) the CLI and the stdio MCP server.

A waiter holds no thread while it waits: it sleeps on the event loop until this process
records a run's end (`RunEnds.notify`, called by whoever writes the end) or until a modest
interval has passed, then reads the run from the store briefly on a worker thread; the
interval is how an end recorded by another node is seen. Each API key may hold only so many
waits at once on a node (FLOOM_MAX_WAITS_PER_KEY), and only so many open streams (log
streams over SSE, the MCP endpoint's event streams: FLOOM_MAX_STREAMS_PER_KEY), so no key
can tie up a node by waiting or following: one count per key and kind (`RunEnds.hold`), one
refusal shape (429 with Retry-After).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import TYPE_CHECKING, Literal, TypeVar, cast

import anyio.to_thread

from floom.errors import RateLimited, TooManyStreams, TooManyWaits
from floom.services.access.principal import Principal
from floom.services.runs.lifecycle import peek_run
from floom.services.runs.records import RunRecord, record_in_session
from floom.services.runs.rules import FINISHED, WAITING
from floom.store.db import read_connection
from floom.store.models import Run

if TYPE_CHECKING:
    from floom.services.context import Context

T = TypeVar("T")

log = logging.getLogger("floom.run_waits")

# How often a waiter reads the store when no end was announced in this process: the delay
# before an end recorded by another node is seen.
STORE_CHECK_SECONDS = 0.5

# How many of the latest run ends this process remembers for waiters that come just after.
RECENT_ENDS = 1024

# How many of a run's waiters have their read done by the thread that recorded its end
# (Listener); the others, rare (several callers waiting on one run), read for themselves,
# so an end never holds its executor slot for a crowd of reads.
DELIVERED_READS = 4

HoldKind = Literal["wait", "stream"]

Until = Literal["ended", "settled"]
# "ended": a final status. "settled": ended, or paused until a person decides (an agent that
# waits on a run wants to hear that it needs an approval, not sit out the wait).
STOP_STATUSES: dict[str, frozenset[str]] = {"ended": FINISHED, "settled": FINISHED | WAITING}


class Listener:
    """One waiter's wake-up call, set from any thread on the waiter's own event loop.

    A waiter that will read the run once it ends may leave its read here (`reader`): the
    thread that records the end then calls it at once, right after its commit, with the
    record it wrote when it has it (the run as the end left it, read back in the end's own
    transaction), and hands the result over with the wake-up. The waiter answers without a
    trip of its own to a worker thread and back, the longest step between a run's end and
    its answer, and without a read of its own."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: Callable[[RunRecord | None], object] | None = None,
    ) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._reader = reader
        self._delivered: object | None = None

    def wake(self) -> None:
        with suppress(RuntimeError):  # the waiter's loop has closed: nobody is left to wake
            self._loop.call_soon_threadsafe(self._event.set)

    def deliver(self, record: RunRecord | None = None) -> None:
        """Wake the waiter with its read done here, from `record` when there is one (just a
        wake-up if it left none, or if the read failed: the waiter then reads for itself)."""
        found = None
        if self._reader is not None:
            try:
                found = self._reader(record)
            except Exception:  # the waiter's own read will meet the problem and say it
                log.debug("a waiter's read at the run's end failed", exc_info=True)
        with suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._hand_over, found)

    def _hand_over(self, found: object | None) -> None:
        self._delivered = found
        self._event.set()

    def take(self) -> object | None:
        """What the end's thread read for this waiter since it last looked, if anything."""
        found, self._delivered = self._delivered, None
        return found

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class RunEnds:
    """This process's notice of run ends, and the count of open waits per API key.

    `notify` may be called from any thread (executor threads record most ends); the waiters
    of that run then read it again. Only its own waiters: with several callers waiting at
    once, waking every waiter at every end cost each end one store read per waiter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, set[Listener]] = {}
        self._held: dict[tuple[HoldKind, str], int] = {}
        # The runs whose end this process told last, newest at the end: a waiter that starts
        # listening just after the end (a run started and ended while its starter's request
        # went back to the event loop) is woken at once instead of at its next store check.
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._end_hooks: list[Callable[[str], object]] = []

    def waited_on(self, run_id: str) -> bool:
        """Whether anyone in this process waits for the run's end right now: whoever records
        it then reads its record back in the same transaction, for `notify`."""
        with self._lock:
            return run_id in self._listeners

    def watch_ends(self, hook: Callable[[str], object]) -> None:
        """Call `hook(run_id)` at every end `notify` hears that left lines of the run in
        run_events, on the recording thread: it must not block (the object store's upkeep
        notes the run and wakes its own thread)."""
        self._end_hooks.append(hook)

    def notify(
        self, run_id: str, record: RunRecord | None = None, *, log_moved: bool = False
    ) -> None:
        """Wake the run's waiters; called by whoever recorded its end, after the commit, on
        that thread: the first DELIVERED_READS waiters' reads are done here, from `record`
        (the run's record as that commit left it) when it is given."""
        with self._lock:
            listeners = list(self._listeners.get(run_id, ()))
            self._recent[run_id] = None
            self._recent.move_to_end(run_id)
            if len(self._recent) > RECENT_ENDS:
                self._recent.popitem(last=False)
        for hook in () if log_moved else self._end_hooks:
            hook(run_id)
        for n, listener in enumerate(listeners):
            if n < DELIVERED_READS:
                listener.deliver(record)
            else:
                listener.wake()

    @contextmanager
    def listening(
        self, run_id: str, *, reader: Callable[[RunRecord | None], object] | None = None
    ) -> Iterator[Listener]:
        """A listener for `run_id`'s end, for the block; `reader` (see Listener) is called
        on the recording thread when the end is announced."""
        listener = Listener(asyncio.get_running_loop(), reader)
        with self._lock:
            self._listeners.setdefault(run_id, set()).add(listener)
            ended_already = run_id in self._recent
        if ended_already:
            listener.wake()
        try:
            yield listener
        finally:
            with self._lock:
                mine = self._listeners.get(run_id)
                if mine is not None:
                    mine.discard(listener)
                    if not mine:
                        del self._listeners[run_id]

    def hold(self, holder: str, *, kind: HoldKind, limit: int) -> Hold:
        """Count one open wait or stream of `holder` (an API key id, or the name floom acts
        for) until the Hold is released, or raise TooManyWaits / TooManyStreams (429, with
        Retry-After) when it already holds `limit` of that kind on this node."""
        with self._lock:
            held = self._held.get((kind, holder), 0)
            if held >= limit:
                raise _refusal(kind, held)
            self._held[(kind, holder)] = held + 1
        return Hold(self, (kind, holder))

    def _release(self, slot: tuple[HoldKind, str]) -> None:
        with self._lock:
            left = self._held[slot] - 1
            if left:
                self._held[slot] = left
            else:
                del self._held[slot]

    @contextmanager
    def holding_wait(self, waiter: str, *, limit: int) -> Iterator[None]:
        """One open wait of `waiter` for the duration (see `hold`)."""
        with self.hold(waiter, kind="wait", limit=limit):
            yield

    def open_waits(self, waiter: str) -> int:
        return self.open_holds(waiter, kind="wait")

    def open_holds(self, holder: str, *, kind: HoldKind) -> int:
        with self._lock:
            return self._held.get((kind, holder), 0)


def hold_stream(ctx: Context, *, holder: str) -> Hold:
    """One open stream (a log stream, an MCP session's event stream) of `holder`, an API key
    id or the name floom acts for, on this node until the Hold is released; TooManyStreams
    (429, with Retry-After) once it holds FLOOM_MAX_STREAMS_PER_KEY."""
    return ctx.node.run_ends.hold(holder, kind="stream", limit=ctx.settings.max_streams_per_key)


class Hold:
    """One counted wait or stream; released once, by `release` or by leaving its block
    (a stream releases from whichever of its ends comes first)."""

    def __init__(self, ends: RunEnds, slot: tuple[HoldKind, str]) -> None:
        self._ends: RunEnds | None = ends
        self._slot = slot

    def release(self) -> None:
        ends, self._ends = self._ends, None
        if ends is not None:
            ends._release(self._slot)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# How long a refused caller is told to wait: a wait answers within a minute, a stream
# lasts as long as its run.
_RETRY_AFTER_SECONDS: dict[HoldKind, int] = {"wait": 1, "stream": 5}


def _refusal(kind: HoldKind, held: int) -> RateLimited:
    details = {"retry_after_seconds": _RETRY_AFTER_SECONDS[kind], "limit": held}
    if kind == "wait":
        return TooManyWaits(
            f"this API key already waits for {held} runs at once, the most this server allows",
            hint="retry once one of those waits has answered, or read the run without waiting",
            details=details,
        )
    return TooManyStreams(
        f"this API key already holds {held} open streams on this server, the most it allows",
        hint="close a stream you no longer read (one per run is enough), or read the log "
        "without following it; the operator sets FLOOM_MAX_STREAMS_PER_KEY",
        details=details,
    )


async def wait_for_end(
    ctx: Context,
    *,
    run_id: str,
    timeout: float,
    until: Until = "ended",
    caller: Principal,
    fresh: Run | None = None,
) -> Run:
    """The run once it has ended (or, with until="settled", also once it waits for a person),
    or as it is when `timeout` seconds have passed. `fresh`: the run as its caller has just
    written it (a start that waits), which spares the first read. Needs the read scope.

    Raises NotFound for an unknown run, and TooManyWaits when the caller already holds
    FLOOM_MAX_WAITS_PER_KEY waits on this node: an API key's waits count against its id;
    floom's own count against the name it acts for (a hook's, "hook:WORKER"), and plain
    floom's against none. A run that has already ended is answered at once and holds no
    wait."""
    run, _ = await wait_and_read(
        ctx, run_id=run_id, timeout=timeout, until=until, caller=caller, fresh=fresh
    )
    return run


async def wait_and_read(
    ctx: Context,
    *,
    run_id: str,
    timeout: float,
    until: Until = "ended",
    caller: Principal,
    fresh: Run | None = None,
    then: Callable[[RunRecord], T] | None = None,
) -> tuple[Run, T | None]:
    """wait_for_end, and `then(record)` called with the run's whole record as found at the
    end of the wait (a stop status of `until`): read in the same transaction as the run, or
    written with its end by this process, so a caller that answers with the whole record
    never reads the run again. None instead of `then`'s result when the wait ran out first,
    or when the run was answered as `fresh` without a read."""
    caller.require("read")
    waiter = caller.key_id or caller.name or None
    stop = STOP_STATUSES[until]
    deadline = time.monotonic() + max(0.0, timeout)
    reader = functools.partial(_read, ctx, run_id, stop, then)
    with ctx.node.run_ends.listening(run_id, reader=reader) as woken:
        # Listening before the first read: an end announced during the read still wakes us.
        if fresh is not None:
            run, extra = fresh, None
        else:
            run, extra = await anyio.to_thread.run_sync(reader, None)
        if run.status in stop or timeout <= 0:
            return run, extra
        held = (
            ctx.node.run_ends.holding_wait(waiter, limit=ctx.settings.max_waits_per_key)
            if waiter is not None
            else nullcontext()
        )
        with held:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return run, None
                await woken.wait(min(left, STORE_CHECK_SECONDS))
                woken.clear()
                delivered = cast("tuple[Run, T | None] | None", woken.take())
                if delivered is not None:  # read by the thread that announced the end
                    run, extra = delivered
                else:
                    run, extra = await anyio.to_thread.run_sync(reader, None)
                if run.status in stop:
                    return run, extra


def wait_for_end_blocking(
    ctx: Context,
    *,
    run_id: str,
    timeout: float,
    until: Until = "ended",
    caller: Principal,
) -> Run:
    """wait_for_end for code on a worker thread (no running event loop in that thread)."""
    return asyncio.run(
        wait_for_end(ctx, run_id=run_id, timeout=timeout, until=until, caller=caller)
    )


def _read(
    ctx: Context,
    run_id: str,
    stop: frozenset[str],
    then: Callable[[RunRecord], T] | None,
    record: RunRecord | None,
) -> tuple[Run, T | None]:
    """The run, and `then` of its record if it is in a stop status: from `record` (written
    by the run's end) when given, else read."""
    if record is None:
        # Core statements only (peek_run, the record's rows): a plain connection will do.
        with read_connection(ctx.engine) as conn:
            run = peek_run(conn, run_id)
            if then is None or run.status not in stop:
                return run, None
            record = record_in_session(ctx, conn, run)
    run = record.run
    return run, then(record) if then is not None and run.status in stop else None
