"""The runs table as a queue: atomic claims, leases, the reaper, and retries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, or_, text
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from floom.services.logs import append_events, lock_events, system_event
from floom.services.run_rules import (
    CANCELLED,
    EXECUTOR,
    EXECUTOR_LOST,
    FAILED,
    QUEUED,
    REAPER,
    RETRYABLE,
    RUNNING,
    mark_claimed,
    requeue_next_attempt,
    transition,
)
from floom.store import signals
from floom.store.blobs import insert_blob
from floom.store.db import session_scope
from floom.store.models import Artifact, Run, UTCDateTime, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context


@dataclass(frozen=True)
class _ClaimQueries:
    any_runnable: Any  # sqlmodel's select types; Any keeps Session.exec's overloads happy
    next_runnable: Any
    next_runnable_except: Any  # passing over the workers found full in this claim
    running_of_worker: Any


@lru_cache(maxsize=1)
def _claim_queries() -> _ClaimQueries:
    """Built once: constructing these statements costs more than running them."""
    now = bindparam("now", type_=UTCDateTime())
    busy = aliased(Run)
    running_of_worker = (
        select(func.count())
        .select_from(busy)
        .where(busy.worker_name == Run.worker_name, busy.status == RUNNING)
        .scalar_subquery()
    )
    runnable = (
        Run.status == QUEUED,
        or_(col(Run.not_before).is_(None), col(Run.not_before) <= now),
    )
    next_runnable = (
        select(Run)
        .where(
            *runnable,
            or_(col(Run.concurrency).is_(None), running_of_worker < col(Run.concurrency)),
        )
        .order_by(col(Run.id))
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return _ClaimQueries(
        any_runnable=select(Run.id).where(*runnable).limit(1),
        next_runnable=next_runnable,
        next_runnable_except=next_runnable.where(
            col(Run.worker_name).not_in(bindparam("full", expanding=True))
        ),
        running_of_worker=select(func.count())
        .select_from(Run)
        .where(Run.worker_name == bindparam("worker"), Run.status == RUNNING),
    )


# The advisory lock key of a worker's claims (hashed to 64 bits by PostgreSQL).
WORKER_LOCK = "floom.worker-claim:"
# Workers found at their limit in one claim before it gives up until the next wake-up.
MAX_FULL_WORKERS_PER_CLAIM = 20


def claim_next_run(ctx: Context, *, look_first: bool = True) -> Run | None:
    """Take the oldest runnable queued run for this node, or None.

    Two nodes never get the same run: PostgreSQL skips rows another claim has locked;
    SQLite serialises the whole step under its write lock. Runs of a worker already at its
    `concurrency` limit are passed over, on every node at once (see `worker_has_room`).
    """
    now = utcnow()
    queries = _claim_queries()
    # A read first when the queue was last seen empty: most such calls find nothing, and a
    # read takes no write lock on SQLite. Draining a busy queue skips it.
    if look_first:
        with session_scope(ctx.engine) as s:
            if s.exec(queries.any_runnable, params={"now": now}).first() is None:
                return None
    full: list[str] = []
    while len(full) <= MAX_FULL_WORKERS_PER_CLAIM:
        with session_scope(ctx.engine, write=True) as s:
            if full:
                params = {"now": now, "full": full}
                run = s.exec(queries.next_runnable_except, params=params).first()
            else:
                run = s.exec(queries.next_runnable, params={"now": now}).first()
            if run is None:
                return None
            if not worker_has_room(s, run):
                full.append(run.worker_name)
                continue  # leaving the transaction frees the row and the worker's lock
            mark_claimed(
                run, node_id=ctx.node_id, lease_seconds=ctx.settings.lease_seconds, now=now
            )
            s.add(run)
            system_event(
                s,
                run_id=run.id,
                attempt=run.attempt,
                message=f"started attempt {run.attempt} of {run.max_attempts} on {ctx.node_id}",
            )
        return run
    return None


def worker_has_room(s: Session, run: Run) -> bool:
    """Whether `run` may start under its worker's `concurrency` limit, counted exactly.

    On PostgreSQL the claim's own count runs under READ COMMITTED beside SKIP LOCKED: two
    nodes claiming two runs of one worker at once each count the other's claim as not yet
    running, and both start. So a limited run's claim takes a transaction-scoped advisory
    lock on its worker and counts again: a second claimer waits for the first to commit
    and then sees its run as running. One claim holds at most one such lock at a time
    (the caller ends the transaction before trying another worker), so claims cannot
    deadlock. On SQLite the claim holds the database's write lock, so counting is enough.
    """
    if run.concurrency is None:
        return True
    if s.get_bind().dialect.name == "postgresql":
        s.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": WORKER_LOCK + run.worker_name},
        )
    running = s.exec(_claim_queries().running_of_worker, params={"worker": run.worker_name}).one()
    return int(running) < run.concurrency


def renew_leases(ctx: Context, run_ids: list[str]) -> tuple[set[str], set[str]]:
    """Extend the leases this node holds. Returns (runs to cancel, runs this node lost)."""
    if not run_ids:
        return set(), set()
    expires = utcnow() + timedelta(seconds=ctx.settings.lease_seconds)
    with session_scope(ctx.engine, write=True) as s:
        rows = s.exec(
            select(Run).where(col(Run.id).in_(run_ids)).with_for_update(skip_locked=True)
        ).all()
        held = set()
        cancel = set()
        for run in rows:
            if run.status != RUNNING or run.lease_owner != ctx.node_id:
                continue
            held.add(run.id)
            run.lease_expires_at = expires
            s.add(run)
            if run.cancel_requested:
                cancel.add(run.id)
    return cancel, set(run_ids) - held


@dataclass
class Outcome:
    """How one attempt ended, as the executor saw it."""

    status: str
    outputs: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    exit_code: int | None = None
    retryable: bool = True
    sandbox_seconds: float = 0.0
    artifacts: list[tuple[str, bytes, str]] = field(default_factory=list)


def finish_attempt(
    ctx: Context,
    *,
    run: Run,
    outcome: Outcome,
    backoff: float,
    exponential: bool = True,
    log_lines: Sequence[tuple[str, str, datetime | None]] = (),
) -> str:
    """Record an attempt's end; a retryable failure with attempts left is queued again.

    `log_lines` are the attempt's last unwritten lines; they are stored first, in the same
    transaction. Returns the run's new status. If this node no longer holds the run (the
    reaper took it after a lost lease), only the lines are written and the status found is
    returned.
    """
    now = utcnow()
    closing: list[tuple[str, str, datetime | None]] = list(log_lines)
    with session_scope(ctx.engine, write=True) as s:
        lock_events(s, run_id=run.id)
        current = s.get(Run, run.id, with_for_update=True)
        if current is None or current.status != RUNNING or current.lease_owner != ctx.node_id:
            if closing:
                append_events(s, run_id=run.id, attempt=run.attempt, lines=closing)
            return current.status if current else CANCELLED
        current.sandbox_seconds += outcome.sandbox_seconds
        current.exit_code = outcome.exit_code
        retry = (
            outcome.status in RETRYABLE
            and outcome.retryable
            and current.attempt < current.max_attempts
        )
        # Artifacts from before exist only after an earlier attempt or a pause for a
        # decision (which always sets the phase): a plain first attempt has none to replace.
        if current.attempt > 1 or current.phase is not None:
            for old in s.exec(select(Artifact).where(Artifact.run_id == run.id)).all():
                s.delete(old)
        if retry:
            delay = backoff * (2 ** (current.attempt - 1)) if exponential else backoff
            message = (
                f"attempt {current.attempt} {outcome.status}: {outcome.error_message}; "
                f"retrying in {delay:.0f}s"
            )
            requeue_next_attempt(
                current,
                by=EXECUTOR,
                now=now,
                delay_seconds=delay,
                ended=outcome.error_code or outcome.status,
            )
        else:
            s.flush()
            for name, data, content_type in outcome.artifacts:
                digest = insert_blob(s, data)
                s.add(
                    Artifact(
                        run_id=run.id,
                        name=name,
                        size=len(data),
                        digest=digest,
                        content_type=content_type,
                    )
                )
            transition(
                current,
                outcome.status,
                by=EXECUTOR,
                now=now,
                error_code=outcome.error_code,
                error_message=outcome.error_message,
            )
            current.outputs_json = (
                json.dumps(outcome.outputs) if outcome.outputs is not None else None
            )
            message = f"{outcome.status}"
            if outcome.error_message:
                message += f": {outcome.error_message}"
        closing.append(("system", message, None))
        append_events(s, run_id=run.id, attempt=run.attempt, lines=closing)
        s.add(current)
        status = current.status
        if current.concurrency is not None:
            # A limited worker has room again: a run of it queued on another node may start.
            signals.publish(s, signals.RUN_QUEUED)
    ctx.notify_run_ended()
    return status


def reap_expired_leases(ctx: Context, *, own_node_restart: bool = False) -> int:
    """Requeue or fail runs whose executor stopped renewing their lease.

    With `own_node_restart`, runs this node id held before a restart are reaped at once:
    the process that held them is gone. Returns how many runs were reaped.
    """
    now = utcnow()
    cond = col(Run.lease_expires_at) < now
    if own_node_restart:
        cond = or_(cond, col(Run.lease_owner) == ctx.node_id)
    with session_scope(ctx.engine, write=True) as s:
        rows = s.exec(
            select(Run).where(Run.status == RUNNING, cond).with_for_update(skip_locked=True)
        ).all()
        for run in rows:
            lost = f"executor {run.lease_owner} stopped (lease expired)"
            if run.cancel_requested:
                transition(
                    run,
                    CANCELLED,
                    by=REAPER,
                    now=now,
                    error_code="cancelled",
                    error_message=f"cancelled; {lost}",
                )
            elif run.attempt < run.max_attempts:
                system_event(s, run_id=run.id, attempt=run.attempt, message=f"{lost}; requeued")
                requeue_next_attempt(run, by=REAPER, now=now, ended=EXECUTOR_LOST)
            else:
                transition(
                    run,
                    FAILED,
                    by=REAPER,
                    now=now,
                    error_code=EXECUTOR_LOST,
                    error_message=f"{lost} and no attempts are left",
                )
            if run.status != QUEUED:
                system_event(s, run_id=run.id, attempt=run.attempt, message=f"{run.status}: {lost}")
            s.add(run)
        count = len(rows)
        if count:
            signals.publish(s, signals.RUN_QUEUED)
    if count:
        ctx.run_queued.set()
    return count
