"""The runs table as a queue: atomic claims, leases, the reaper, and retries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, or_
from sqlalchemy.orm import aliased
from sqlmodel import col, select

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
from floom.store.blobs import insert_blob
from floom.store.db import session_scope
from floom.store.models import Artifact, Run, UTCDateTime, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context


@dataclass(frozen=True)
class _ClaimQueries:
    any_runnable: Any  # sqlmodel's select types; Any keeps Session.exec's overloads happy
    next_runnable: Any


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
    return _ClaimQueries(
        any_runnable=select(Run.id).where(*runnable).limit(1),
        next_runnable=select(Run)
        .where(
            *runnable,
            or_(col(Run.concurrency).is_(None), running_of_worker < col(Run.concurrency)),
        )
        .order_by(col(Run.id))
        .limit(1)
        .with_for_update(skip_locked=True),
    )


def claim_next_run(ctx: Context, *, look_first: bool = True) -> Run | None:
    """Take the oldest runnable queued run for this node, or None.

    Two nodes never get the same run: PostgreSQL skips rows another claim has locked;
    SQLite serialises the whole step under its write lock. Runs of a worker already at its
    `concurrency` limit are passed over.
    """
    now = utcnow()
    queries = _claim_queries()
    # A read first when the queue was last seen empty: most such calls find nothing, and a
    # read takes no write lock on SQLite. Draining a busy queue skips it.
    if look_first:
        with session_scope(ctx.engine) as s:
            if s.exec(queries.any_runnable, params={"now": now}).first() is None:
                return None
    with session_scope(ctx.engine, write=True) as s:
        run = s.exec(queries.next_runnable, params={"now": now}).first()
        if run is None:
            return None
        mark_claimed(run, node_id=ctx.node_id, lease_seconds=ctx.settings.lease_seconds, now=now)
        s.add(run)
        system_event(
            s,
            run_id=run.id,
            attempt=run.attempt,
            message=f"started attempt {run.attempt} of {run.max_attempts} on {ctx.node_id}",
        )
    return run


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
        ctx.run_queued.set()
    return count
