"""The executor: runs the attempts its dispatch (floom/engine/dispatch.py) hands it in the
sandbox, streams their logs, keeps their leases, reaps expired ones and orphaned sandboxes."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from floom.engine.attempt import (
    Attempt,
    cancelled_outcome,
    drop_partial_unpacks,
    run_script,
    sandbox_unavailable_outcome,
)
from floom.engine.cleanup import empty_folder, reap_sandbox_orphans
from floom.engine.dispatch import Dispatch, StartedAttempt
from floom.engine.phases import AgentRunner, execute_phased, is_phased
from floom.engine.queue import (
    NextClaim,
    Outcome,
    finish_attempt,
    reap_expired_leases,
    renew_held_leases,
    save_unsaved_transcript,
)
from floom.engine.runlog import LogBudget, LogLine, RunLog
from floom.engine.runtime import NodeRuntime
from floom.engine.work_root import hold_work_root, release_work_root
from floom.errors import BlobStoreUnavailable, RowLocked, RunErrorCode, StoreUnavailable
from floom.sandbox import configuration_problem, get_sandbox
from floom.sandbox.base import Sandbox, SandboxUnavailable
from floom.sandbox.fence import fence_key, margin_seconds, node_fence
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from floom.services.runs.logs import append_events, system_event
from floom.services.runs.rules import (
    CANCELLED,
    EXECUTOR,
    FAILED,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    requeue_next_attempt,
)
from floom.services.workers import versions as workers
from floom.store import signals
from floom.store.db import UNAVAILABLE, database_clock, session_scope
from floom.store.models import Run

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.services.context import Context
    from floom.store.models import Version

log = logging.getLogger("floom.executor")

LOG_FLUSH_SECONDS = 0.1
# What a call raises while the database cannot be reached (translated by the store or not).
STORE_DOWN: tuple[type[Exception], ...] = (StoreUnavailable, *UNAVAILABLE)
STORE_OR_BLOBS_DOWN: tuple[type[Exception], ...] = (*STORE_DOWN, BlobStoreUnavailable)


class Executor:
    """Runs queued runs on this node, up to `executor_slots` at a time."""

    def __init__(self, ctx: Context, sandbox: Sandbox, *, run_agent: AgentRunner) -> None:
        self.ctx = ctx
        self.sandbox = sandbox
        # Every backend this node has run sandboxes with, by name, for orphan reaping.
        self.backends: dict[str, Sandbox] = {sandbox.name: sandbox}
        self._backends_lock = threading.Lock()
        if sandbox.name != "e2b" and configuration_problem("e2b", ctx.settings) is None:
            # Built now so that its orphans are reaped from the start, before any run asks.
            self.backends["e2b"] = get_sandbox("e2b", ctx.settings)
        self.run_agent = run_agent
        self.runtime = NodeRuntime.of(ctx)
        self._stop = threading.Event()
        self.dispatch = Dispatch(
            self, self.runtime, count=ctx.settings.executor_slots, stopping=self._stop
        )
        self.slots = self.dispatch.count
        # Shared with the dispatch, which counts the slots the attempts here take.
        self._active_lock = self.dispatch.lock
        self._active = self.dispatch.active
        # Set once no attempt runs here any more: leases are renewed until then, through a
        # drain too, or another node would take a draining run over and run it again.
        self._attempts_over = threading.Event()
        self._interrupt_now = threading.Event()
        self._stopping = threading.Lock()
        self._stopped = False
        # Set when an attempt starts here: the log flusher sleeps on it while none runs.
        self._attempt_started = threading.Event()
        self._cancel: set[str] = set()
        self._interrupted: set[str] = set()
        self._threads: list[threading.Thread] = []
        # When the database last failed a call of this executor (monotonic), if ever.
        self._store_failed_at: float | None = None

    # lifecycle

    def start(self) -> None:
        # First: what follows empties the work root and kills every sandbox on it, which
        # is only right when no other process runs sandboxes from it.
        hold_work_root(self.ctx.settings.data_dir)
        # Work dirs left by a killed process belong to runs the reaper requeues below; no
        # run is live here yet, so every sandbox this node left is an orphan.
        orphans = self._reap_sandboxes(live_run_ids=frozenset)
        if orphans:
            log.warning("killed %d sandbox(es) a previous process left running", orphans)
        empty_folder(self.ctx.settings.work_root)
        drop_partial_unpacks(self.ctx.settings.data_dir)
        reaped = reap_expired_leases(self.ctx, own_node_restart=True)
        if reaped:
            log.warning("requeued or failed %d run(s) abandoned by a previous process", reaped)
        for target, name in (
            (self.dispatch.loop, "floom-dispatch"),
            (self._heartbeat_loop, "floom-heartbeat"),
            (self._flush_loop, "floom-logs"),
            (self._reap_loop, "floom-reaper"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.runtime.dispatch = self.dispatch

    def stop(self, *, grace_seconds: float | None = None) -> None:
        """Stop claiming; give running attempts `grace_seconds` (the drain setting by
        default) to end, or until `interrupt_now`, then interrupt the rest: each is requeued
        as a new attempt that costs none of its retries. A second call (the API's drain, then
        the node's end) waits for the first and does nothing more."""
        with self._stopping:
            if self._stopped:
                return
            self._stop_now(grace_seconds)
            self._stopped = True

    def _stop_now(self, grace_seconds: float | None) -> None:
        self._stop.set()
        if self.runtime.dispatch is self.dispatch:
            self.runtime.dispatch = None
        self.runtime.queued.set()
        self._attempt_started.set()
        self.dispatch.freed.set()
        if grace_seconds is None:
            grace_seconds = self.ctx.settings.drain_seconds
        if self.active_count():
            log.warning(
                "draining: %d run(s) still running get up to %g s to end; "
                "signal again to interrupt them now",
                self.active_count(),
                grace_seconds,
            )
        deadline = time.monotonic() + grace_seconds
        # Slots held for runs being queued count: their runs start here, and drain too.
        while self.dispatch.taken() and time.monotonic() < deadline:
            if self._interrupt_now.wait(0.05):
                break
        with self._active_lock:
            if self._active:
                log.warning("interrupting %d run(s); each is requeued", len(self._active))
            self._interrupted.update(self._active)
        self.dispatch.pool.shutdown(wait=True)
        self._attempts_over.set()
        for t in self._threads:
            t.join(timeout=5)
        self._flush_all()
        with self._backends_lock:
            backends = list(self.backends.values())
        for backend in backends:
            backend.close()
        release_work_root(self.ctx.settings.data_dir)

    def interrupt_now(self) -> None:
        """End a drain at once (a second signal): running attempts are interrupted."""
        self._interrupt_now.set()

    def active_count(self) -> int:
        with self._active_lock:
            return len(self._active)

    # what the dispatch hands over (floom.engine.dispatch.SlotRunner)

    def attempt_ahead(self, run: Run, version: Version, manifest: Manifest) -> Attempt:
        return Attempt(
            self,
            run=run,
            version=version,
            manifest=manifest,
            run_log=self.new_run_log(run),
            ahead=True,
        )

    def attempt_begins(self, run_id: str) -> None:
        self._cancel.discard(run_id)
        self._attempt_started.set()

    def attempt_ended(self, run_id: str) -> None:
        self._cancel.discard(run_id)
        self.runtime.local_cancels.discard(run_id)

    # loops

    def _heartbeat_loop(self) -> None:
        clock = database_clock(self.ctx.engine)
        while not self._attempts_over.wait(self.ctx.settings.heartbeat_seconds):
            with self._active_lock:
                seen = dict(self._active)
            try:
                if seen:
                    # The database's clock read again at every beat that renews a lease
                    # (one statement, off the claims' path); idle, at its first use after
                    # CLOCK_READ_SECONDS.
                    clock.refresh()
                renewal = renew_held_leases(
                    self.ctx, {run_id: run_log.epoch for run_id, run_log in seen.items()}
                )
            except Exception as exc:  # a missed heartbeat is survivable; the lease has slack
                self.log_failure("heartbeat failed", exc)
                continue
            # Committed: the watchdog may let the sandboxes live on, counted from a time no
            # later than the one the stored expiry was counted from.
            deadline = renewal.counted_from + self._lease_left(self.ctx.settings.lease_seconds)
            fence = node_fence()
            with self._active_lock:
                # Only the attempts this heartbeat looked at: a run that paused for approval
                # may already run again here as a new attempt, which must not inherit this.
                current = {r for r in seen if self._active.get(r) is seen[r]}
                self._cancel.update((renewal.cancel | renewal.lost) & current)
            for run_id in renewal.renewed & current:
                fence.arm(_fence_of(seen[run_id]), deadline)

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            if not self.active_count():
                # Nothing runs here, so nothing to flush: sleep until an attempt starts.
                self._attempt_started.clear()
                if not self.active_count():
                    self._attempt_started.wait()
                continue
            if self._stop.wait(LOG_FLUSH_SECONDS):
                return
            self._flush_all(waited=LOG_FLUSH_SECONDS)

    def _flush_all(self, *, waited: float = 0.0) -> None:
        """Write the active runs' pending lines (with `waited`: those waiting that long)."""
        with self._active_lock:
            logs = list(self._active.values())
        for run_log in logs:
            try:
                run_log.flush(self.ctx, waited=waited)
            except Exception as exc:  # the lines stay buffered for the next flush
                if self._store_failed_at is not None and isinstance(exc, STORE_DOWN):
                    self._store_failed_at = time.monotonic()  # said once by the others
                else:
                    self.log_failure(f"log flush failed for {run_log.run_id}", exc)

    def _reap_loop(self) -> None:
        next_orphan_pass = time.monotonic() + self.ctx.settings.sandbox_reap_seconds
        while not self._stop.wait(self.ctx.settings.reap_interval_seconds):
            if not self._store_settled():
                continue
            try:
                # The runs live here are never taken from this node by its own reaper: a
                # late heartbeat (a starved CPU, a slow write) would have it kill them.
                reap_expired_leases(self.ctx, live=self._live_attempts())
            except Exception as exc:  # the next pass retries
                self.log_failure("reaper failed", exc)
            if time.monotonic() >= next_orphan_pass:
                next_orphan_pass = time.monotonic() + self.ctx.settings.sandbox_reap_seconds
                orphans = self._reap_sandboxes(live_run_ids=self._live_run_ids)
                if orphans:
                    log.warning("killed %d orphaned sandbox(es) of this node", orphans)

    def _live_run_ids(self) -> set[str]:
        return self.dispatch.live_run_ids()

    def _live_attempts(self) -> dict[str, int]:
        """The attempts running here whose lease has not lapsed (a lapsed one's sandbox is
        being ended by the watchdog: its run is the reaper's like any other)."""
        fence = node_fence()
        with self._active_lock:
            logs = list(self._active.items())
        return {
            run_id: run_log.attempt
            for run_id, run_log in logs
            if not fence.lapsed(_fence_of(run_log))
        }

    def _reap_sandboxes(self, *, live_run_ids: Callable[[], Collection[str]]) -> int:
        return reap_sandbox_orphans(
            self.backends.values(),
            node_id=self.ctx.node_id,
            work_root=self.ctx.settings.work_root,
            live_run_ids=live_run_ids,
        )

    def warm_stats(self) -> dict[str, Any] | None:
        """Warm starts on this node, for /healthz and /metrics: the default backend's
        (Sandbox.warm_stats), with the E2B backend's pools under `e2b` when it keeps some
        (floom/sandbox/e2b/warm.py). None when no backend has warm starts."""
        with self._backends_lock:
            backends = dict(self.backends)
        found = self.sandbox.warm_stats() if self.sandbox.name != "e2b" else None
        e2b = backends["e2b"].warm_stats() if "e2b" in backends else None
        if e2b is None:
            return found
        base = found or {"enabled": False, "hits": 0, "misses": 0, "pools": []}
        return {**base, "e2b": e2b}

    def sandbox_for(self, manifest: Manifest) -> Sandbox:
        """The sandbox backend a worker's runs use: the one its worker.yml names, else the
        node's default. Raises SandboxUnavailable, naming the setting, when the named one is
        not configured here (it was when the worker was deployed)."""
        name = manifest.sandbox.backend or self.sandbox.name
        problem = configuration_problem(name, self.ctx.settings)
        if problem is not None:
            raise SandboxUnavailable(
                f"this worker runs in the {name} sandbox, which this server has not "
                f"configured: {problem}",
                hint="set it in the floom server's environment, or remove sandbox.backend "
                "from worker.yml and deploy again",
                retryable=False,
            )
        with self._backends_lock:
            backend = self.backends.get(name)
            if backend is None:
                backend = self.backends[name] = get_sandbox(name, self.ctx.settings)
        return backend

    # the database going away

    def log_failure(self, what: str, exc: Exception) -> None:
        """An unreachable database is one line in the log (presence.py says when it is back);
        anything else is a bug and gets its traceback."""
        if isinstance(exc, RowLocked):
            # The database answers: leases are renewed, so the reaper need not wait.
            log.warning("%s: another node holds a row it needs; trying again", what)
        elif isinstance(exc, STORE_DOWN):
            self._store_failed_at = time.monotonic()
            log.warning("%s: database unreachable", what)
        else:
            log.exception(what)

    def _store_settled(self) -> bool:
        """Whether the database has answered for a whole lease since it last failed here.

        While it was away no node could renew a lease, so every lease may look expired the
        moment it returns; reaping then would take runs from live nodes that are about to
        renew them and record their results. Waiting one lease gives them that time; a node
        that really died meanwhile is reaped one lease later than usual.
        """
        failed = self._store_failed_at
        return failed is None or time.monotonic() - failed > self.ctx.settings.lease_seconds

    # one attempt

    def new_run_log(self, run: Run) -> RunLog:
        settings = self.ctx.settings
        budget = None
        if settings.log_lines_per_second or settings.log_bytes_per_second:
            budget = LogBudget(
                lines_per_second=settings.log_lines_per_second,
                bytes_per_second=settings.log_bytes_per_second,
            )
        return RunLog(
            run_id=run.id,
            attempt=run.attempt,
            redactor=Redactor([]),
            max_lines=settings.max_log_lines_per_run,
            max_bytes=settings.max_log_bytes_per_run,
            epoch=run.lease_epoch,
            budget=budget,
        )

    def _lease_left(self, seconds: float) -> float:
        """How long after a lease's start its sandboxes may live: the lease less the
        watchdog's margin to end them before any node may take the lease."""
        return seconds - margin_seconds(self.ctx.settings.lease_seconds)

    def arm_fence(self, run: Run) -> None:
        """The watchdog's first deadline for the attempt: its claim's lease, as stored (on the
        database's clock, read with a time never earlier than the database's, so the
        deadline comes no later than the moment the database's clock reaches the expiry)."""
        counted_from, now = database_clock(self.ctx.engine).reading()
        left = float(self.ctx.settings.lease_seconds)
        if run.lease_expires_at is not None:
            left = (run.lease_expires_at - now).total_seconds()
        node_fence().arm(fence_key(run.id, run.lease_epoch), counted_from + self._lease_left(left))

    def run_claimed_inline(self, run: Run) -> None:
        """Run an attempt this node just claimed in the calling thread, as a slot would: an
        agent waiting on its child run must not wait for a free slot it may itself hold."""
        self.dispatch.run_in_slot(run, self.dispatch.begin(run, held=False), keep_slot=False)

    def should_cancel(self, run_id: str) -> bool:
        """Whether the attempt of `run_id` on this node is to stop: cancelled by a caller,
        its lease lost, or this node shutting down."""
        if (
            run_id in self._cancel
            or run_id in self.runtime.local_cancels
            or run_id in self._interrupted
        ):
            return True
        run_log = self._active.get(run_id)
        return run_log is not None and node_fence().lapsed(_fence_of(run_log))

    def run_attempt(
        self,
        run: Run,
        run_log: RunLog,
        *,
        ahead: StartedAttempt | None = None,
        then_claim: NextClaim | None = None,
    ) -> str | None:
        """Run one attempt (started `ahead`, or from the beginning) and record its end, with
        the slot's next claim when `then_claim` asks for it (queue.NextClaim); the run's
        status then (None when its end was not recorded)."""
        started = time.monotonic()
        outcome, backoff, exponential = self._outcome(run, run_log, ahead)
        outcome.sandbox_seconds = outcome.sandbox_seconds or (time.monotonic() - started)
        status: str | None = None
        fence = _fence_of(run_log)
        try:
            lines = run_log.drain()
            if node_fence().lapsed(fence):
                # Its lease was not renewed in time, so the watchdog ended its sandbox (or
                # is ending it): what it left says nothing of the script. The reaper of some
                # node requeues or fails the run once the lease is past its grace.
                log.warning(
                    "run %s attempt %d: its lease was not renewed in time; its sandbox was "
                    "ended and its end (%d log line(s)) is not recorded",
                    run.id,
                    run.attempt,
                    len(lines),
                )
            else:
                status = self._record_end(
                    run,
                    run_log,
                    outcome,
                    lines,
                    backoff=backoff,
                    exponential=exponential,
                    then_claim=then_claim,
                )
        finally:
            node_fence().forget(fence)
            # Something may have become claimable: the run itself (queued again), or a run of
            # its limited worker that a claim passed over.
            if status in (None, QUEUED) or run.concurrency is not None:
                self.runtime.queued.set()
        return status

    def _outcome(
        self, run: Run, run_log: RunLog, ahead: StartedAttempt | None
    ) -> tuple[Outcome, float, bool]:
        """How the attempt ended, with the backoff of its retry (seconds, exponential)."""
        try:
            if ahead is not None:
                attempt = ahead.attempt
                manifest = attempt.manifest
            else:
                version = workers.get_version(self.ctx, version_id=run.version_id, caller=SYSTEM)
                manifest = workers.manifest_of(version)
                attempt = Attempt(
                    self, run=run, version=version, manifest=manifest, run_log=run_log
                )
            try:
                if ahead is not None:
                    outcome = run_script(attempt, ahead=ahead.use())
                elif is_phased(manifest):
                    outcome = execute_phased(attempt, run_agent=self.run_agent)
                else:
                    outcome = run_script(attempt)
            except SandboxUnavailable as exc:
                outcome = sandbox_unavailable_outcome(exc, attempt.redactor)
            outcome.agent = attempt.version.kind == "agent"
            return (
                outcome,
                float(manifest.retries.backoff_seconds),
                manifest.retries.backoff != "fixed",
            )
        except STORE_OR_BLOBS_DOWN as exc:
            # The database (or the object store holding the version's archive) went away
            # while the attempt was being prepared or recorded on the way: not the worker's
            # failure, so it is requeued (once the store is back) without costing one of
            # its retries.
            self.log_failure(f"run {run.id} interrupted", exc)
            self._interrupted.add(run.id)
            return cancelled_outcome(), 0.0, False
        except Exception as exc:  # an attempt must always end in a recorded state
            log.exception("run %s crashed in the executor", run.id)
            # The system's reason of an OSError (never its paths, which are the host's).
            said = f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else ""
            outcome = Outcome(
                status=FAILED,
                error_code=RunErrorCode.EXECUTOR_ERROR,
                error_message=f"floom could not run this attempt: {type(exc).__name__}{said}",
                retryable=True,
            )
            return outcome, 5.0, True

    def _record_end(
        self,
        run: Run,
        run_log: RunLog,
        outcome: Outcome,
        lines: list[LogLine],
        *,
        backoff: float,
        exponential: bool,
        then_claim: NextClaim | None = None,
    ) -> str | None:
        """Store how the attempt ended; returns the run's status then (None if it was not
        stored). While the database is unreachable, keep the result and try again until it
        answers (the slot stays taken; the lease is renewed once the database is back): a
        result in hand is never thrown away for a few seconds' outage. Other failures are
        tried three times, then left to the reaper, which requeues the run once its lease
        expires."""
        other_failures = 0
        delay = 0.25
        # Taken once the lines are drained (no flush after): what the end uploads unread.
        kept = run_log.kept()
        while True:
            try:
                if run.id in self._interrupted and outcome.status == CANCELLED:
                    # Requeued to resume where its loop left it.
                    save_unsaved_transcript(self.ctx, outcome)
                    self.requeue_interrupted(run, lines)
                    self._interrupted.discard(run.id)
                    return QUEUED
                return finish_attempt(
                    self.ctx,
                    run=run,
                    outcome=outcome,
                    backoff=backoff,
                    exponential=exponential,
                    log_lines=lines,
                    then_claim=then_claim,
                    kept=kept,
                )
            except STORE_DOWN as exc:
                self.log_failure(f"recording the end of {run.id} failed", exc)
                if self._stop.is_set():
                    return None
            except Exception:  # a bug must not strand the run; the reaper takes it over
                log.exception("recording the end of %s failed", run.id)
                other_failures += 1
                if other_failures >= 3:
                    return None
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)

    def requeue_interrupted(self, run: Run, lines: list[LogLine]) -> None:
        with session_scope(self.ctx.engine, write=True) as s:
            if lines:
                append_events(s, run_id=run.id, attempt=run.attempt, lines=lines)
            current = s.get(Run, run.id, with_for_update=True)
            if (
                current is None
                or current.status != RUNNING
                or current.lease_owner != self.ctx.node_id
                or current.attempt != run.attempt
                or current.lease_epoch != run.lease_epoch
                or current.cancel_requested
            ):
                return
            why = "node shutdown" if self._stop.is_set() else "the database going away"
            system_event(
                s, run_id=run.id, attempt=current.attempt, message=f"interrupted by {why}; requeued"
            )
            # An interruption is not the worker's failure: it costs none of its retries.
            requeue_next_attempt(current, by=EXECUTOR, counts_as_attempt=False, ended=INTERRUPTED)
            s.add(current)
            signals.publish(s, signals.RUN_QUEUED)  # for the nodes that stay up


def _fence_of(run_log: RunLog) -> str:
    """The watchdog's key of the attempt whose lines `run_log` holds."""
    return fence_key(run_log.run_id, run_log.epoch or 0)


@contextmanager
def interrupt_on_signal(executor: Executor) -> Iterator[None]:
    """While the executor drains, a second SIGINT or SIGTERM (the server took the first one
    to begin shutting down) interrupts the running attempts at once. Signal handlers can
    only be set from the main thread; elsewhere the drain runs its full time."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda *_: executor.interrupt_now())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
