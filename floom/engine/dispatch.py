"""Which run runs in which of this node's executor slots, and when: the dispatcher's claims,
a run taken in its own queueing transaction (claim on create, its sandbox started ahead
while that commits), and a slot going on to the next queued run itself (next in slot).

A slot is free, held (for a run about to start here: claimed on create, or the next run of
a slot whose attempt just ended), or taken by a running attempt. Dispatch is the one place
that counts them; the executor (floom/engine/executor.py) runs the attempts it hands over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from floom.engine.attempt import start_script_ahead
from floom.engine.phases import is_phased
from floom.engine.queue import Claim, NextClaim, claim_next
from floom.services.runs.rules import QUEUED, RUNNING
from floom.services.workers import versions as workers
from floom.store.db import database_clock

if TYPE_CHECKING:
    from datetime import datetime

    from floom.engine.attempt import Attempt
    from floom.engine.runlog import LogLine, RunLog
    from floom.engine.runtime import NodeRuntime
    from floom.manifest.schema import Manifest
    from floom.sandbox.base import StartedAhead
    from floom.services.context import Context
    from floom.store.models import Run, RunEvent, Version

log = logging.getLogger("floom.executor")

# How long an idle dispatcher that hears every signal waits before it looks at the queue
# again anyway (a signal is a hint: a run it missed is claimed this late at worst). It polled
# every FLOOM_POLL_INTERVAL_SECONDS: two reads a second per node with nothing to do.
IDLE_CLAIM_SECONDS = 10.0


class SlotRunner(Protocol):
    """What the dispatch hands runs to (the executor): it prepares and runs attempts, and
    records how they end; the dispatch decides which run has which slot."""

    ctx: Context

    def new_run_log(self, run: Run) -> RunLog:
        """The buffer of the log lines of `run`'s attempt about to start."""
        ...

    def arm_fence(self, run: Run) -> None:
        """The lease watchdog's first deadline for `run`'s attempt, claimed here."""
        ...

    def attempt_begins(self, run_id: str) -> None:
        """`run_id`'s attempt took its slot (called under Dispatch.lock)."""
        ...

    def run_attempt(
        self,
        run: Run,
        run_log: RunLog,
        *,
        ahead: StartedAttempt | None,
        then_claim: NextClaim | None = None,
    ) -> str | None:
        """Run the attempt (started `ahead`, or from the beginning) and record its end, with
        the slot's next claim when `then_claim` asks for it; the run's status then, or None
        when its end was not recorded."""
        ...

    def attempt_ended(self, run_id: str) -> None:
        """`run_id`'s attempt left its slot (called under Dispatch.lock)."""
        ...

    def attempt_ahead(self, run: Run, version: Version, manifest: Manifest) -> Attempt:
        """A new attempt of `run`, about to be started ahead."""
        ...

    def requeue_interrupted(self, run: Run, lines: list[LogLine]) -> None:
        """Requeue `run`, claimed here, as interrupted (costing none of its retries)."""
        ...

    def log_failure(self, what: str, exc: Exception) -> None: ...


class StartedAttempt:
    """An attempt started ahead (Dispatch.start_ahead): its work dir prepared and its sandbox
    waiting to run its command. Either used by its attempt or discarded, once."""

    def __init__(self, dispatch: Dispatch, attempt: Attempt, sandbox: StartedAhead) -> None:
        self.attempt = attempt
        self._dispatch = dispatch
        self._sandbox: StartedAhead | None = sandbox

    def use(self) -> StartedAhead:
        """The sandbox, for the attempt's run_script (which discards the work dir after)."""
        sandbox, self._sandbox = self._sandbox, None
        assert sandbox is not None, "a sandbox started ahead is used once"
        return sandbox

    def discard(self) -> None:
        """End the sandbox and the work dir unless the attempt used them: the run was not
        started here after all (refused, queued behind others, or the node stopping).
        Never raises: the refusal or requeue it serves must reach its caller, and the run
        dir (a disk of its own on a root floom) goes whatever ending the sandbox met."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        run_id = self.attempt.run.id
        try:
            sandbox.discard()
        except Exception:
            log.exception("run %s: ending its sandbox started ahead failed", run_id)
        finally:
            try:
                self.attempt.discard()
            except Exception:
                log.exception("run %s: its run dir started ahead was not let go of", run_id)
            finally:
                self._dispatch.forget_ahead(run_id)


class Dispatch:
    """This node's executor slots, `count` of them, and the runs that take them."""

    def __init__(
        self,
        runner: SlotRunner,
        runtime: NodeRuntime,
        *,
        count: int,
        stopping: threading.Event,
    ) -> None:
        self.runner = runner
        self.runtime = runtime
        self.count = max(1, count)
        self.stopping = stopping
        self.pool = ThreadPoolExecutor(self.count, thread_name_prefix="floom-run")
        self.lock = threading.Lock()
        # The attempts running here, by run (under `lock`).
        self.active: dict[str, RunLog] = {}
        # Set when an attempt ends here: the dispatcher sleeps on it while all slots are taken.
        self.freed = threading.Event()
        # Whether the last claim saw another runnable run queued besides the one it took.
        self.more_queued = False
        # Runs whose sandbox was started ahead while they are being queued (start_ahead):
        # live here, though not active yet.
        self.ahead: set[str] = set()
        # Slots held for runs about to start here; changed by `_hold` only.
        self._held = 0
        # The lines stored with a run claimed on create (lines_stored), until it starts.
        self._first_lines: dict[str, Sequence[RunEvent]] = {}

    # counting

    def _hold(self, slots: int) -> None:
        """Hold (or, negative, let go of) `slots` slots; the caller holds `lock`."""
        self._held += slots

    def taken(self) -> int:
        """Slots taken by running attempts or held for runs about to start."""
        with self.lock:
            return len(self.active) + self._held

    def reserve(self) -> bool:
        """Hold a free slot; False when none is free or the node is stopping. A held slot is
        then either started (`start_claimed`) or `release`d."""
        with self.lock:
            if self.stopping.is_set() or len(self.active) + self._held >= self.count:
                return False
            self._hold(1)
            return True

    def release(self) -> None:
        """Give back a held slot: its run is not started here after all."""
        with self.lock:
            self._hold(-1)
        self.freed.set()

    def live_run_ids(self) -> set[str]:
        with self.lock:
            return set(self.active) | self.ahead

    # claim on create

    def lines_stored(self, run_id: str, lines: Sequence[RunEvent]) -> None:
        """NodeHooks.lines_stored: the lines of a run being taken (`taking`), all it has,
        for its attempt's copy (RunLog.keep_stored)."""
        with self.lock:
            self._first_lines[run_id] = lines

    @contextmanager
    def taking(self, run: Run, version: Version, *, start_ahead: bool) -> Iterator[bool]:
        """NodeHooks.slot_for of a node whose executor runs: hold a free slot for `run`
        while its queueing transaction runs (with `start_ahead`, its sandbox starts
        meanwhile); then start it in that slot if it was committed as claimed here, or give
        the slot back."""
        if not self.reserve():
            yield False
            return
        # Read now: a queueing transaction that fails leaves `run` expired and detached.
        run_id = run.id
        ahead: StartedAttempt | None = None
        try:
            if start_ahead:
                ahead = self.start_ahead(run, version)
            yield True
        except BaseException:
            self._give_back(ahead)
            raise
        finally:
            with self.lock:
                lines = self._first_lines.pop(run_id, None)
        if run.status == RUNNING and run.lease_owner == self.runner.ctx.node_id:
            self.start_claimed(run, ahead, lines)
        else:
            self._give_back(ahead)

    def _give_back(self, ahead: StartedAttempt | None) -> None:
        if ahead is not None:
            ahead.discard()
        self.release()

    def start_ahead(self, run: Run, version: Version) -> StartedAttempt | None:
        """Start the attempt of `run`, being queued for the slot held for it, up to its
        sandbox's command while its queueing transaction commits: the sandbox's own start
        (a few processes' execs) then overlaps the commit. Only for a plain script on a
        backend that can (Sandbox.start_ahead), and not while runs queue here: a run queued
        behind them would not start here. The command waits for `start_claimed`; anything
        that fails here returns None and happens again, said, on the attempt's own path."""
        manifest = workers.manifest_of(version)
        queued_here = self.more_queued or self.runtime.queued.is_set()
        if queued_here or self.stopping.is_set() or is_phased(manifest):
            return None
        attempt = self.runner.attempt_ahead(run, version, manifest)
        with self.lock:
            self.ahead.add(run.id)  # not an orphan for the reaper, from before its start
        try:
            sandbox = start_script_ahead(attempt)
        except Exception:  # the attempt's own path meets it again and says it there
            log.debug("starting run %s ahead failed", run.id, exc_info=True)
            sandbox = None
        if sandbox is None:
            self.forget_ahead(run.id)
            return None
        return StartedAttempt(self, attempt, sandbox)

    def forget_ahead(self, run_id: str) -> None:
        """`run_id`'s sandbox started ahead is gone: the reaper may take what is left."""
        with self.lock:
            self.ahead.discard(run_id)

    def start_claimed(
        self,
        run: Run,
        ahead: StartedAttempt | None = None,
        lines: Sequence[RunEvent] | None = None,
    ) -> None:
        """Run `run`, committed as claimed by this node, in the slot held for it (from
        `ahead` when it was started ahead; `lines`: all it has stored, when known)."""
        try:
            self.launch(run, ahead, held=True, lines=lines)
        except RuntimeError:
            # The pool shut down meanwhile (a drain ran out): the run is requeued as an
            # interrupted attempt, as the runs still running then were.
            with self.lock:
                self.active.pop(run.id, None)
            if ahead is not None:
                ahead.discard()
            self.runner.requeue_interrupted(run, [])
            self.runtime.queued.set()

    # the dispatcher's claims

    def loop(self) -> None:
        """The dispatcher: claims queued runs for free slots until the node stops."""
        settings = self.runner.ctx.settings
        # Whether the next claim reads first: not when the last claim saw another runnable
        # run, nor when a wake-up just said a run was queued (most likely it is claimable).
        look_first = True
        queued = self.runtime.queued
        while not self.stopping.is_set():
            try:
                if self.taken() >= self.count:
                    # Full: sleep until an attempt ends, not in a spin.
                    self.freed.clear()
                    if self.taken() >= self.count:
                        self.freed.wait(settings.poll_interval_seconds)
                    continue
                queued.clear()
                claim = claim_next(self.runner.ctx, look_first=look_first)
                self.more_queued = claim.more
                if claim.run is not None:
                    self.launch(claim.run)
                if claim.more:
                    look_first = False
                    continue
                if claim.run is None and not look_first and self.runtime.signals_heard():
                    # Woken, and nothing to claim: look first (the look also says when a run
                    # held back by its retry's backoff is due), then sleep long.
                    look_first = True
                    continue
                # Nothing else to claim: until a run is queued (set since the clear).
                look_first = not self._idle(claim.held_until)
            except Exception as exc:  # the loop must survive a database hiccup; it retries
                self.runner.log_failure("dispatch failed; retrying", exc)
                look_first = True
                self.stopping.wait(1.0)

    def _idle(self, held_until: datetime | None) -> bool:
        """Wait, with nothing to claim, until a run is queued (True) or it is time to look
        again (False). Every poll interval, unless this node hears every signal: then every
        run queued on any node wakes it, and only a retry's backoff ends unannounced, so it
        looks again when the first held-back run becomes runnable, at the latest after
        IDLE_CLAIM_SECONDS, or as soon as the signals are no longer heard."""
        queued, poll = self.runtime.queued, self.runner.ctx.settings.poll_interval_seconds
        if not self.runtime.signals_heard():
            return queued.wait(poll)
        wait = IDLE_CLAIM_SECONDS
        if held_until is not None:
            now = database_clock(self.runner.ctx.engine).now()  # held_until's clock
            wait = min(wait, max(0.0, (held_until - now).total_seconds()))
        until = time.monotonic() + wait
        while (left := until - time.monotonic()) > 0:
            if queued.wait(min(left, poll)):
                return True
            if self.stopping.is_set() or not self.runtime.signals_heard():
                return False
        return queued.is_set()

    def launch(
        self,
        run: Run,
        ahead: StartedAttempt | None = None,
        *,
        held: bool = False,
        lines: Sequence[RunEvent] | None = None,
    ) -> None:
        """Run `run`'s attempt, claimed here, in a slot thread (in the slot `held` for it;
        `lines`: all it has stored, when known)."""
        run_log = self.begin(run, ahead, held=held, lines=lines)
        self.pool.submit(self._run_slot, run, run_log, ahead)

    def begin(
        self,
        run: Run,
        ahead: StartedAttempt | None = None,
        *,
        held: bool,
        lines: Sequence[RunEvent] | None = None,
    ) -> RunLog:
        """`run`'s attempt takes its slot, free or `held` for it, in one step (no claim
        sees the slot free between): its run log (started ahead, or new) is active, with a
        copy of the run's stored `lines` when they are known (RunLog.keep_stored)."""
        try:
            run_log = ahead.attempt.run_log if ahead is not None else self.runner.new_run_log(run)
            # Made before its claim, a run log started ahead learns the claim's epoch now.
            run_log.epoch = run.lease_epoch
            if lines is not None:
                run_log.keep_stored(lines)
            self.runner.arm_fence(run)
        except BaseException:
            if held:
                self.release()
            raise
        with self.lock:
            if held:
                self._hold(-1)
            self.active[run.id] = run_log
            self.ahead.discard(run.id)
            self.runner.attempt_begins(run.id)
        return run_log

    # next in slot

    def _run_slot(self, run: Run, run_log: RunLog, ahead: StartedAttempt | None = None) -> None:
        """Run the attempt, then, while runs are queued, the next ones in this same slot and
        thread: in a burst each slot goes from one run to the next without waking the
        dispatcher and handing the run over to a pool thread."""
        next_run: Run | None = run
        while next_run is not None:
            then_claim = NextClaim(self._takes_next)
            kept = self.run_in_slot(next_run, run_log, ahead=ahead, then_claim=then_claim)
            ahead = None
            if not kept:
                return
            next_run = self._next_in_slot(then_claim.claim)
            if next_run is not None:
                run_log = self.begin(next_run, held=True)

    def run_in_slot(
        self,
        run: Run,
        run_log: RunLog,
        *,
        keep_slot: bool = True,
        ahead: StartedAttempt | None = None,
        then_claim: NextClaim | None = None,
    ) -> bool:
        """Run one attempt in its slot; returns True when the slot was kept, as held, for
        the next queued run (`keep_slot` and the queue likely holds one: runs were queued
        since the dispatcher last looked, or its last claim saw more). With `then_claim`,
        the attempt's end may have claimed that run already: the slot is then kept for it
        (even if a drain began since: the run is this node's), or let go when the claim
        found none."""
        status = self.runner.run_attempt(run, run_log, ahead=ahead, then_claim=then_claim)
        folded = then_claim.claim if then_claim is not None else None
        with self.lock:
            # A resumed run may already be back here as a new attempt: leave that one be.
            if self.active.get(run.id) is run_log:
                self.active.pop(run.id, None)
                self.runner.attempt_ended(run.id)
            if folded is not None:
                kept = folded.run is not None
                self.more_queued = folded.more
            else:
                # Kept only while no drain is under way: the slot then holds no new run.
                kept = (
                    keep_slot
                    and status is not None
                    and not self.stopping.is_set()
                    and (self.more_queued or self.runtime.queued.is_set())
                )
            if kept:
                self._hold(1)
        if not kept:
            self.freed.set()
        return kept

    def _takes_next(self, status: str) -> bool:
        """Whether a slot whose run just ended as `status` takes the next queued run (asked
        inside the end's transaction, as run_in_slot asks after it): not while a drain is
        under way, and only when the queue likely holds one (queued since the dispatcher last
        looked, the last claim saw more, or the run itself was queued again)."""
        return not self.stopping.is_set() and (
            self.more_queued or self.runtime.queued.is_set() or status == QUEUED
        )

    def _next_in_slot(self, claimed: Claim | None = None) -> Run | None:
        """The next queued run for the slot `run_in_slot` kept (held), which it then takes:
        `claimed` with the last run's end, or claimed now; frees the slot when there is
        none, or when the claim fails (the dispatcher retries)."""
        if claimed is not None:
            return claimed.run  # the slot was kept only for a run
        run: Run | None = None
        try:
            claim = claim_next(self.runner.ctx, look_first=not self.more_queued)
            self.more_queued = claim.more
            run = claim.run
        except Exception as exc:  # the dispatcher's own claim retries; the slot is freed
            self.runner.log_failure("claiming the next run in a slot failed", exc)
        if run is None:
            with self.lock:
                self._hold(-1)
            self.freed.set()
        return run
