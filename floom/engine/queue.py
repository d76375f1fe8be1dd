"""The runs table as a queue: atomic claims, leases, the reaper, and retries."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache, partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, delete, func, insert, or_, text, update
from sqlmodel import col, select

from floom import jsonvalues
from floom.errors import RunErrorCode
from floom.sandbox.fence import lease_clock
from floom.services.ops import end_logs
from floom.services.runs import agent as agent_runs
from floom.services.runs.lifecycle import ANY_RUNNABLE, any_runnable_statement
from floom.services.runs.logs import append_events, lock_events, system_event
from floom.services.runs.records import RunRecord, record_in_session
from floom.services.runs.rules import (
    CANCELLED,
    EXECUTOR,
    EXECUTOR_LOST,
    FAILED,
    FINISHED,
    QUEUED,
    REAPER,
    RETRYABLE,
    RULE_FIELDS,
    RUNNING,
    SUCCEEDED,
    RunFields,
    check_transition,
    claimed_fields,
    kept_error,
    requeue_next_attempt,
    started_message,
    transition,
)
from floom.services.workers import state as worker_state
from floom.store import signals
from floom.store.blobs.rows import DATABASE, insert_blob, stage_blob
from floom.store.db import (
    Writer,
    database_clock,
    is_postgres,
    on_postgres,
    read_connection,
    savepoint,
    session_scope,
    write_connection,
)
from floom.store.models import Artifact, Run, UTCDateTime, trusted_row, utcnow
from floom.store.statements import hot
from floom.vocabulary import RunStatus

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.store.agents import Transcript

log = logging.getLogger("floom.executor")


@dataclass(frozen=True)
class _ClaimStatements:
    any_runnable: Any  # sqlmodel's select types; Any keeps Session.exec's overloads happy
    # A runnable run's id (or NULL) and the earliest time a held-back run (a retry's backoff)
    # becomes runnable (or NULL): the look before a claim, one read.
    look: Any
    claim: Any
    claim_except: Any  # passing over the workers found full in this claim
    running_of_worker: Any


@lru_cache(maxsize=1)
def _claim_statements() -> _ClaimStatements:
    """Built once: constructing these statements costs more than running them.

    The claim is one UPDATE of the oldest runnable queued run that RETURNs it: PostgreSQL
    picks it with SKIP LOCKED, so claims on several nodes never wait on each other's row;
    SQLite runs it under the write lock. A worker's `concurrency` counts its running runs
    in the same statement.
    """
    check_transition(QUEUED, RUNNING, by=EXECUTOR)  # the move the statement makes
    runs = Run.__table__  # type: ignore[attr-defined]
    now = bindparam("now", type_=UTCDateTime())
    candidate = runs.alias("candidate")
    busy = runs.alias("busy")
    running_of_candidate = (
        select(func.count())
        .select_from(busy)
        .where(busy.c.worker_name == candidate.c.worker_name, busy.c.status == RUNNING)
        .scalar_subquery()
    )
    runnable = (
        candidate.c.status == QUEUED,
        or_(candidate.c.not_before.is_(None), candidate.c.not_before <= now),
    )
    oldest = (
        select(candidate.c.id)
        .where(
            *runnable,
            or_(candidate.c.concurrency.is_(None), running_of_candidate < candidate.c.concurrency),
        )
        .order_by(candidate.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    fields = claimed_fields(node_id="", lease_seconds=0, now=utcnow())
    claim = (
        update(runs)
        .values(
            {
                **{name: bindparam(name, type_=runs.c[name].type) for name in fields},
                # The attempt's fencing token: every write of it presents this epoch.
                "lease_epoch": runs.c.lease_epoch + 1,
            }
        )
        .returning(*runs.c)
    )
    full: Any = bindparam("full", expanding=True)
    held_until = (
        select(func.min(runs.c.not_before))
        .where(runs.c.status == QUEUED, runs.c.not_before > now)
        .scalar_subquery()
    )
    return _ClaimStatements(
        any_runnable=any_runnable_statement(),
        look=select(
            any_runnable_statement().scalar_subquery().label("runnable"),
            held_until.label("held_until"),
        ),
        claim=claim.where(runs.c.id == oldest.scalar_subquery(), runs.c.status == QUEUED),
        claim_except=claim.where(
            runs.c.id == oldest.where(candidate.c.worker_name.not_in(full)).scalar_subquery(),
            runs.c.status == QUEUED,
        ),
        running_of_worker=select(func.count())
        .select_from(runs)
        .where(runs.c.worker_name == bindparam("worker"), runs.c.status == RUNNING),
    )


# The advisory lock key of a worker's claims (hashed to 64 bits by PostgreSQL).
WORKER_LOCK = "floom.worker-claim:"
# Workers found at their limit in one claim before it gives up until the next wake-up.
MAX_FULL_WORKERS_PER_CLAIM = 20


@dataclass(frozen=True)
class Claim:
    """What a claim took (None: nothing runnable), and whether another runnable run was
    queued besides it (the dispatcher then claims again at once)."""

    run: Run | None
    more: bool = False
    # When nothing was runnable: the earliest time a queued run held back by its retry's
    # backoff becomes runnable (None: no such run), which no signal announces.
    held_until: datetime | None = None


def claim_next_run(ctx: Context, *, look_first: bool = True) -> Run | None:
    """Take the oldest runnable queued run for this node, or None (see `claim_next`)."""
    return claim_next(ctx, look_first=look_first).run


def claim_next(ctx: Context, *, look_first: bool = True) -> Claim:
    """Take the oldest runnable queued run for this node, if any.

    Two nodes never get the same run: PostgreSQL skips rows another claim has locked;
    SQLite serialises the whole step under its write lock. Runs of a worker already at its
    `concurrency` limit are passed over, on every node at once (see `worker_has_room`).
    The lease it writes, and the time runs held back are compared with, are on the
    database's clock (DatabaseClock: no statement more).
    """
    now = database_clock(ctx.engine).now()
    # A read first when the queue was last seen empty: most such calls find nothing, and a
    # read takes no write lock on SQLite. Draining a busy queue skips it.
    if look_first:
        with read_connection(ctx.engine) as conn:
            looked = _LOOK.rows(conn, {"now": now})[0]
        runnable, held_until = looked["runnable"], looked["held_until"]
        if runnable is None:
            return Claim(None, held_until=held_until)
    postgres = is_postgres(ctx.engine)
    full: list[str] = []
    while len(full) <= MAX_FULL_WORKERS_PER_CLAIM:
        try:
            # Core statements only: a plain connection, not an ORM session (write_connection).
            with write_connection(ctx.engine) as s:
                return _claim_in(ctx, s, now=now, full=full, postgres=postgres)
        except _WorkerFull:
            continue
    return Claim(None)


def _claim_in(ctx: Context, s: Writer, *, now: datetime, full: list[str], postgres: bool) -> Claim:
    """claim_next's statements, in the write transaction `s`. Raises _WorkerFull (the
    worker's name added to `full`) when the run it took on PostgreSQL must be given back."""
    params: dict[str, Any] = {
        "now": now,
        **claimed_fields(node_id=ctx.node_id, lease_seconds=ctx.settings.lease_seconds, now=now),
    }
    if full:
        found = s.execute(_claim_statements().claim_except, {**params, "full": full}).first()
        row = None if found is None else dict(found._mapping)
    else:
        row = _CLAIM.first(s, params)
    if row is None:
        return Claim(None)
    run = trusted_row(Run, row)
    # On SQLite the statement counted under the write lock: exact already.
    if postgres and not worker_has_room(s, run):
        full.append(run.worker_name)
        # Undone with the transaction, which also frees the worker's lock.
        raise _WorkerFull
    system_event(
        s,
        run_id=run.id,
        attempt=run.attempt,
        message=started_message(run, node_id=ctx.node_id),
    )
    # One more statement here spares the dispatcher a claim that finds nothing.
    more = ANY_RUNNABLE.first(s, {"now": now}) is not None
    return Claim(run, more)


@dataclass
class NextClaim:
    """A slot's request that its attempt's end also claim the slot's next run, in the end's
    own write transaction: on SQLite one write-lock hold a run instead of two (the end, then
    the claim), the lock every writer of a burst queues for. `wanted(status)`, asked inside
    the transaction with the run's new status, says whether the slot takes a next run; once
    the end is committed, `claim` is what the claim took (its run None: nothing runnable).
    `claim` stays None when no claim was made with the end (not wanted, the end not
    recorded, PostgreSQL, or the claim failed and was undone alone): the slot then claims
    on its own, as before."""

    wanted: Callable[[str], bool]
    claim: Claim | None = None


def _claim_with_end(ctx: Context, s: Writer, then_claim: NextClaim, status: str) -> Claim | None:
    """The next claim of `then_claim`'s slot in the end's transaction `s` (SQLite only: on
    PostgreSQL a claim that passes over a full worker undoes itself, which inside the end
    would take a savepoint's round trips, the ones the fold saves). Under a savepoint: a
    claim that fails is undone alone, the end stands."""
    if is_postgres(ctx.engine) or not then_claim.wanted(status):
        return None
    try:
        with savepoint(s):
            return _claim_in(ctx, s, now=database_clock(ctx.engine).now(), full=[], postgres=False)
    except Exception as exc:  # the end is recorded either way; the slot claims on its own
        log.warning("claiming the next run with an end failed: %s", type(exc).__name__)
        return None


class _WorkerFull(Exception):
    """The claimed run's worker is at its limit: the claim's transaction is rolled back."""


def worker_has_room(s: Writer, run: Run) -> bool:
    """Whether `run` may run under its worker's `concurrency` limit, counted exactly: the
    worker's other running runs, seen from this write transaction, are fewer than the limit.
    `run` is either claimed in this transaction already (the queue's claim on PostgreSQL)
    or a queued run about to be (an agent's child run).

    On PostgreSQL a count runs under READ COMMITTED beside SKIP LOCKED: two nodes claiming
    two runs of one worker at once each count the other's claim as not yet running, and
    both start. So a limited run's claim takes a transaction-scoped advisory lock on its
    worker and counts again: a second claimer waits for the first to commit and then sees
    its run as running. One claim holds at most one such lock at a time (the caller ends
    the transaction before trying another worker), so claims cannot deadlock. On SQLite the
    write lock makes any count in the transaction exact.
    """
    if run.concurrency is None:
        return True
    if on_postgres(s):
        s.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": WORKER_LOCK + run.worker_name},
        )
    return _count_running(s, run) < run.concurrency


def _count_running(s: Writer, run: Run) -> int:
    """Running runs of `run`'s worker other than `run` itself."""
    count = s.execute(_claim_statements().running_of_worker, {"worker": run.worker_name}).one()
    return int(count[0]) - (1 if run.status == RUNNING else 0)


def renew_leases(ctx: Context, run_ids: list[str]) -> tuple[set[str], set[str]]:
    """Extend the leases this node holds. Returns (runs to cancel, runs this node lost)."""
    renewal = renew_held_leases(ctx, dict.fromkeys(run_ids))
    return renewal.cancel, renewal.lost


@dataclass(frozen=True)
class Renewal:
    """What a heartbeat's renewal did: the runs to cancel, the runs this node lost, the runs
    whose lease it extended (committed), and when, on the fence's clock (lease_clock:
    CLOCK_BOOTTIME, which counts a suspend as the lease does), it took the time the new
    expiry was counted from (no later than that: a watchdog deadline counted from it never
    outlasts the stored lease)."""

    cancel: set[str]
    lost: set[str]
    renewed: set[str]
    counted_from: float


def renew_held_leases(ctx: Context, epochs: Mapping[str, int | None]) -> Renewal:
    """Extend the leases this node holds of the runs in `epochs` (run id -> the lease epoch
    its attempt here was claimed with; None: any).

    A run is lost only when its row is no longer running under this node's lease of that
    epoch. On PostgreSQL a row that another transaction has locked right now (a cancel, a
    decision, the attempt's own end) is skipped, not waited for, and it is not lost for that:
    the next heartbeat renews it (a lease outlasts several heartbeats) or finds what
    changed. Such a row's lease is not extended, so it is not in `renewed`.
    """
    run_ids = list(epochs)
    if not run_ids:
        return Renewal(set(), set(), set(), lease_clock())

    def ours(run_id: str, status: str, owner: str | None, epoch: int) -> bool:
        wanted = epochs.get(run_id)
        return status == RUNNING and owner == ctx.node_id and (wanted is None or wanted == epoch)

    with session_scope(ctx.engine, write=True) as s:
        # Taken once in the transaction: a wait for SQLite's write lock must not come off
        # the lease. The expiry is on the database's clock, counted from a time no earlier
        # than the database's at `counted_from` (DatabaseClock.reading): the watchdog's
        # deadline, counted from `counted_from`, comes first.
        counted_from, now = database_clock(ctx.engine).reading()
        expires = now + timedelta(seconds=ctx.settings.lease_seconds)
        rows = s.exec(
            select(Run).where(col(Run.id).in_(run_ids)).with_for_update(skip_locked=True)
        ).all()
        held = set()
        renewed = set()
        cancel = set()
        for run in rows:
            if not ours(run.id, run.status, run.lease_owner, run.lease_epoch):
                continue
            held.add(run.id)
            renewed.add(run.id)
            run.lease_expires_at = expires
            s.add(run)
            if run.cancel_requested:
                cancel.add(run.id)
        locked = set(run_ids) - {run.id for run in rows}
        if locked:
            # Read without a lock, so as it was last committed: still this node's, it is kept.
            found = s.exec(
                select(Run.id, Run.status, Run.lease_owner, Run.lease_epoch).where(
                    col(Run.id).in_(locked)
                )
            ).all()
            held.update(row[0] for row in found if ours(*row))
    return Renewal(cancel, set(run_ids) - held, renewed, counted_from)


@dataclass
class StateChange:
    """A worker state attempt's part of its end: the state version it started from, the new
    state it left as JSON (None: unchanged), and whether a conflict runs it again."""

    base: int
    new_json: str | None = None
    retry_on_conflict: bool = False
    # Which worker of the name the run read its state from (worker_state.Base.owner).
    owner: datetime | None = None


# Attempts a run with `state: {on_conflict: retry}` may make in all before a conflict ends it.
CONFLICT_ATTEMPTS = 10


@dataclass
class Outcome:
    """How one attempt ended, as the executor saw it."""

    status: RunStatus
    outputs: dict[str, Any] | None = None
    error_code: RunErrorCode | None = None
    error_message: str | None = None
    exit_code: int | None = None
    retryable: bool = True
    sandbox_seconds: float = 0.0
    artifacts: list[tuple[str, bytes, str]] = field(default_factory=list)
    # For a worker with `state:`; committed with the run's success (services/workers/state.py).
    state: StateChange | None = None
    # An agent's attempt; with the transcript as its loop last saved it, its record (the
    # transcript's text and its tool calls) goes into its log's object at its end. An agent
    # attempt without it (it ended before its loop began) records its lines as rows, which
    # the upload loop moves with its record (services/ops/end_logs.py).
    agent: bool = False
    transcript: Transcript | None = None
    # The transcript's last step is not saved yet (floom/agent/loop.py): the end saves it,
    # or puts its text into the log's object and writes its figures (save_unsaved_transcript).
    transcript_unsaved: bool = False


def finish_attempt(
    ctx: Context,
    *,
    run: Run,
    outcome: Outcome,
    backoff: float,
    exponential: bool = True,
    log_lines: Sequence[tuple[str, str, datetime | None]] = (),
    then_claim: NextClaim | None = None,
    kept: end_logs.KeptLog | None = None,
) -> str:
    """Record an attempt's end; a retryable failure with attempts left is queued again.

    `log_lines` are the attempt's last unwritten lines; they are stored first, in the same
    transaction. Returns the run's new status. If this node no longer holds the run (the
    reaper took it after a lost lease, or it paused for a decision), only the lines are
    written and the status found is returned.

    The run's row is written by one UPDATE that holds only while this node still holds this
    attempt (running, its lease, its attempt number); the new values come from the rules
    applied to a copy of the run as claimed (`run` itself is left as it was, so a write that
    failed can be tried again).

    While new blobs go to an object store, a run that ends for good has its whole log (its
    lines stored so far, `log_lines` and the closing line) uploaded as its object first, and
    the transaction records that object instead of appending rows (services/ops/end_logs.py);
    from `kept`, the executor's copy of the lines stored so far, when it has one, else read
    back first. A copy that another writer's line outdated (the end's count of the lines it
    deletes tells) is given up: the lines are read back and uploaded again.

    With `then_claim`, the same transaction claims the slot's next run (NextClaim).
    """
    # The database's clock: a retry's backoff ends when every node's claim says so.
    now = database_clock(ctx.engine).now()
    values, message, retry, status = _end_values(
        run, outcome, now=now, backoff=backoff, exponential=exponential
    )
    end_log = None
    closing = [*log_lines, ("system", message, now)]
    transcript = outcome.transcript if outcome.agent else None
    # A state written at the end names its version in the closing line, known only inside
    # the transaction: such ends append their lines as before.
    if (
        status in FINISHED
        and (not outcome.agent or outcome.transcript is not None)
        and (outcome.state is None or outcome.state.new_json is None)
    ):
        end_log = end_logs.stage_end_log(
            ctx, run=run, closing=closing, now=now, transcript=transcript, kept=kept
        )
    if end_log is None:
        save_unsaved_transcript(ctx, outcome)
    record = partial(
        _record_attempt_end,
        ctx,
        run=run,
        outcome=outcome,
        log_lines=log_lines,
        now=now,
        ended=(values, message, retry, status),
        then_claim=then_claim,
    )
    try:
        ended_as = record(end_log=end_log)
    except end_logs.LogChanged:
        # Rolled back. A copy another writer outdated: the lines read back, uploaded again.
        assert end_log is not None
        given_up = [end_log]
        again = (
            end_logs.stage_end_log(ctx, run=run, closing=closing, now=now, transcript=transcript)
            if end_log.kept
            else None
        )
        ended = None
        if again is not None:
            try:
                ended = record(end_log=again, abandoned=given_up)
            except end_logs.LogChanged:
                given_up.append(again)
        if ended is None:
            # Recorded with the lines as rows, the objects given up.
            save_unsaved_transcript(ctx, outcome)
            return record(end_log=None, abandoned=given_up)
        ended_as = ended
    # The object not recorded (this node no longer held the run): saved as the loop would.
    save_unsaved_transcript(ctx, outcome)
    return ended_as


def save_unsaved_transcript(ctx: Context, outcome: Outcome) -> None:
    """Save the transcript of an agent attempt whose last step its loop left unsaved: where
    its end does not put it into the run's log object (the database store, a retry, a bucket
    away, an end not recorded), as the loop would have. Once."""
    if outcome.transcript_unsaved and outcome.transcript is not None:
        agent_runs.save_transcript(ctx, outcome.transcript)
        outcome.transcript_unsaved = False


def _record_attempt_end(
    ctx: Context,
    *,
    run: Run,
    outcome: Outcome,
    log_lines: Sequence[tuple[str, str, datetime | None]],
    now: datetime,
    end_log: end_logs.EndLog | None,
    ended: tuple[dict[str, Any], str, bool, str],
    abandoned: Sequence[end_logs.EndLog] = (),
    then_claim: NextClaim | None = None,
) -> str:
    """finish_attempt's transaction; `abandoned`: objects staged for the log that this end
    does not record, to be deleted."""
    closing: list[tuple[str, str, datetime | None]] = list(log_lines)
    values, message, retry, status = ended
    held = {
        "held_id": run.id,
        "held_owner": ctx.node_id,
        "held_attempt": run.attempt,
        "held_epoch": run.lease_epoch,
        "sandbox_seconds_added": outcome.sandbox_seconds,
    }
    record: RunRecord | None = None
    # This attempt's artifacts are the run's only ones: earlier ones are deleted below.
    artifacts: list[Artifact] = []
    # Made durable before the transaction: an object store's upload may take a while, and
    # a store that is away leaves them in the row as pending uploads (rows.stage_blob).
    staged = (
        [
            (name, stage_blob(ctx.settings, ctx.engine, data), content_type)
            for name, data, content_type in outcome.artifacts
        ]
        if not retry and outcome.artifacts
        else []
    )
    with write_connection(ctx.engine) as s:
        lock_events(s, run_id=run.id)
        for given_up in abandoned:
            end_logs.abandon_end_log(s, given_up)
        written = _finish_statement(tuple(values)).first(s, {**values, **held})
        if written is None:
            if end_log is not None:
                end_logs.abandon_end_log(s, end_log)
            found = s.execute(select(Run.status, Run.lease_epoch).where(Run.id == run.id)).first()
            if found is None:
                return CANCELLED
            if found[1] != run.lease_epoch:
                refuse_fenced(run, now_epoch=found[1], what="end", lines=len(closing))
            elif closing:
                # Still this attempt's lease epoch: it ended the lease itself (paused for a
                # decision, cancelled); its last lines belong to its log.
                append_events(s, run_id=run.id, attempt=run.attempt, lines=closing, locked=True)
            return str(found[0])
        change = outcome.state
        if change is not None and change.new_json is not None and status == SUCCEEDED:
            committed = worker_state.commit_from_run(
                s,
                worker_name=run.worker_name,
                base=change.base,
                owner=change.owner,
                state_json=change.new_json,
                run_id=run.id,
                keep=ctx.settings.state_history,
            )
            if committed is None:
                # Another run or an operator wrote the state since this one read it: its
                # success is not recorded, nor is its state.
                outcome = _conflict_outcome(run, outcome, change)
                values, message, retry, status = _end_values(
                    run, outcome, now=now, backoff=0.0, exponential=False
                )
                if retry:
                    values["outputs_json"] = None
                rewritten = s.execute(
                    _rewrite_statement(tuple(values)), {**values, "held_id": run.id}
                ).first()
                written = dict(rewritten._mapping) if rewritten is not None else written
            else:
                message += f" (state version {committed} written)"
        if retry and written["cancel_requested"]:
            # Cancelled while this attempt ran, which ended before its executor saw it: the
            # run ends cancelled, not queued again (its next claim would clear the request).
            outcome = Outcome(
                status=CANCELLED,
                error_code=RunErrorCode.CANCELLED,
                error_message="cancelled while its attempt ended "
                f"({outcome.error_code or outcome.status}); not retried",
                exit_code=outcome.exit_code,
                retryable=False,
                sandbox_seconds=outcome.sandbox_seconds,
                state=outcome.state,
            )
            values, message, retry, status = _end_values(
                run, outcome, now=now, backoff=0.0, exponential=False
            )
            rewritten = s.execute(
                _rewrite_statement(tuple(values)), {**values, "held_id": run.id}
            ).first()
            written = dict(rewritten._mapping) if rewritten is not None else written
        # Artifacts from before exist only after an earlier attempt or a pause for a
        # decision (which always sets the phase): a plain first attempt has none to replace.
        if run.attempt > 1 or run.phase is not None:
            s.execute(delete(Artifact).where(col(Artifact.run_id) == run.id))
        # Rows of artifacts already in the bucket, recorded by the log's statement (below)
        # rather than by an INSERT each (artifacts name their blob by digest, no key).
        with_log = [
            blob
            for _, blob, _ in staged
            if end_log is not None and blob.location != DATABASE and not blob.pending
        ]
        # On PostgreSQL with the log in an object, the artifacts' rows go into the log's
        # statement (below) when all their bytes are in the bucket.
        folded = end_logs.artifacts_folded(s, end_log, len(staged), len(with_log))
        rows: list[dict[str, Any]] = []
        if staged:
            # One INSERT of plain rows: the values are floom's own (collected and named by
            # floom/engine/collect.py), so building, validating and flushing ORM objects for
            # them bought nothing.
            rows = [
                {
                    "run_id": run.id,
                    "name": name,
                    "size": blob.size,
                    "digest": blob.digest if blob in with_log else insert_blob(s, blob),
                    "content_type": content_type,
                    "created_at": now,
                }
                for name, blob, content_type in staged
            ]
            if not folded:
                stored = ARTIFACTS_INSERT.rows(s, rows)
                artifacts = sorted(
                    (trusted_row(Artifact, row) for row in stored), key=attrgetter("name")
                )
        if end_log is not None:
            ids = end_logs.record_end_log(
                s, end_log, blobs=with_log, artifacts=rows if folded else ()
            )
            if folded:
                artifacts = sorted(
                    (trusted_row(Artifact, {**row, "id": ids[row["name"]]}) for row in rows),
                    key=attrgetter("name"),
                )
        else:
            closing.append(("system", message, None))
            append_events(s, run_id=run.id, attempt=run.attempt, lines=closing, locked=True)
        if run.concurrency is not None:
            # A limited worker has room again: a run of it queued on another node may start.
            signals.publish(s, signals.RUN_QUEUED)
        if ctx.node.run_ends.waited_on(run.id):
            # Its waiters answer with the record as this transaction leaves it (the row as
            # the UPDATE returned it), not with a read of their own after the commit.
            ended_run = trusted_row(Run, written)
            record = record_in_session(ctx, s, ended_run, artifacts=artifacts)
        # Last: the next run's claim holds its rows locked for the shortest time.
        claimed = None if then_claim is None else _claim_with_end(ctx, s, then_claim, status)
    if then_claim is not None:
        then_claim.claim = claimed  # committed with the end
    if end_log is not None:
        # Committed: the transcript's text is in the object, its figures in its row.
        outcome.transcript_unsaved = False
    ctx.node.run_ended(run.id, record, log_moved=end_log is not None)
    return status


def _end_values(
    run: Run, outcome: Outcome, *, now: datetime, backoff: float, exponential: bool
) -> tuple[dict[str, Any], str, bool, str]:
    """What an attempt's end writes to its run (the rules applied to a copy of the run as
    claimed), the closing log line, whether it is retried, and the run's new status."""
    ended = RunFields.of(run)
    ended.status = RUNNING  # as the UPDATE finds it, or it writes nothing
    conflict_retry = (
        outcome.error_code == RunErrorCode.STATE_CONFLICT
        and outcome.state is not None
        and outcome.state.retry_on_conflict
        and run.attempt < CONFLICT_ATTEMPTS
    )
    retry = conflict_retry or (
        outcome.status in RETRYABLE and outcome.retryable and run.attempt < run.max_attempts
    )
    if retry:
        delay = backoff * (2 ** (run.attempt - 1)) if exponential else backoff
        message = (
            f"attempt {run.attempt} {outcome.status}: {kept_error(outcome.error_message)}; "
            f"retrying in {delay:.0f}s"
        )
        requeue_next_attempt(
            ended,
            by=EXECUTOR,
            now=now,
            delay_seconds=delay,
            # A conflict is no failure of the worker's: it costs none of its retries.
            counts_as_attempt=not conflict_retry,
            # Every failed or timed-out outcome names its code.
            ended=outcome.error_code or RunErrorCode.EXECUTOR_ERROR,
        )
    else:
        transition(
            ended,
            outcome.status,
            by=EXECUTOR,
            now=now,
            error_code=outcome.error_code,
            error_message=outcome.error_message,
        )
        message = f"{outcome.status}"
        if outcome.error_message:
            message += f": {kept_error(outcome.error_message)}"
    values: dict[str, Any] = {name: getattr(ended, name) for name in RULE_FIELDS}
    values["exit_code"] = outcome.exit_code
    if not retry:
        values["outputs_json"] = (
            jsonvalues.dumps(outcome.outputs, where="outputs")
            if outcome.outputs is not None
            else None
        )
    if outcome.state is not None:
        values["state_base"] = outcome.state.base
    return values, message, retry, ended.status


def _conflict_outcome(run: Run, outcome: Outcome, change: StateChange) -> Outcome:
    again = change.retry_on_conflict and run.attempt < CONFLICT_ATTEMPTS
    tail = "; it runs again from the newer state" if again else ""
    if change.retry_on_conflict and not again:
        tail = f"; gave up after {run.attempt} attempts"
    return Outcome(
        status=FAILED,
        error_code=RunErrorCode.STATE_CONFLICT,
        error_message=f"the state of worker '{run.worker_name}' changed after this run read "
        f"version {change.base}; its new state was not written{tail}",
        exit_code=outcome.exit_code,
        outputs=outcome.outputs,
        retryable=again,
        sandbox_seconds=outcome.sandbox_seconds,
        state=change,
    )


@lru_cache(maxsize=4)
def _rewrite_statement(columns: tuple[str, ...]) -> Any:
    """A second write of the attempt's end in the transaction whose first one held (the row
    is locked by it): a success turned into a state conflict."""
    runs = Run.__table__  # type: ignore[attr-defined]
    values: dict[str, Any] = {name: bindparam(name, type_=runs.c[name].type) for name in columns}
    return update(runs).where(runs.c.id == bindparam("held_id")).values(values).returning(*runs.c)


def _artifacts_insert() -> Any:
    """The INSERT of an attempt's artifacts, returning the rows it stored (for the record)."""
    table = Artifact.__table__  # type: ignore[attr-defined]
    return insert(table).returning(*table.c)


ARTIFACTS_INSERT = hot.Statement(
    "artifacts.insert",
    _artifacts_insert,
    keys=("run_id", "name", "size", "digest", "content_type", "created_at"),
)
_CLAIM = hot.Statement("queue.claim", lambda: _claim_statements().claim)
_LOOK = hot.Statement("queue.look", lambda: _claim_statements().look)


@lru_cache(maxsize=8)
def _finish_statement(columns: tuple[str, ...]) -> hot.Statement:
    """The attempt's end as one UPDATE of `columns` (and the sandbox time added), matching
    only while this node holds this attempt under its lease epoch (the fencing token) and
    returning the row it wrote; built once per column set."""
    runs = Run.__table__  # type: ignore[attr-defined]
    values: dict[str, Any] = {name: bindparam(name, type_=runs.c[name].type) for name in columns}
    values["sandbox_seconds"] = runs.c.sandbox_seconds + bindparam("sandbox_seconds_added")
    statement = (
        update(runs)
        .where(
            runs.c.id == bindparam("held_id"),
            runs.c.status == RUNNING,
            runs.c.lease_owner == bindparam("held_owner"),
            runs.c.attempt == bindparam("held_attempt"),
            runs.c.lease_epoch == bindparam("held_epoch"),
        )
        .values(values)
        .returning(*runs.c)
    )
    return hot.Statement("queue.finish", lambda: statement)


def refuse_fenced(run: Run, *, now_epoch: int, what: str, lines: int = 0) -> None:
    """Say in the node's log that a fenced attempt's write was refused (nothing was written)."""
    more = f" and {lines} log line(s)" if lines else ""
    log.warning(
        "run %s attempt %d is fenced (its lease epoch %d, the run's now %d): its late %s%s "
        "were refused",
        run.id,
        run.attempt,
        run.lease_epoch,
        now_epoch,
        what,
        more,
    )


def reap_expired_leases(
    ctx: Context, *, own_node_restart: bool = False, live: Mapping[str, int] | None = None
) -> int:
    """Requeue or fail runs whose executor stopped renewing their lease.

    `live` maps the runs whose attempts run in the calling process to their attempt number:
    their executor has not stopped, whatever their lease says (a heartbeat late behind a
    starved CPU or a slow write), so their leases are renewed here instead. Another node
    cannot see them and reaps an expired lease all the same: that is what a lease is for.

    A lease is taken only `lease_grace_seconds` after it expired: the node that held it had
    its watchdog end the attempt's sandbox before the expiry (floom/sandbox/fence.py), and
    the grace covers that kill and the round trip of a node's reading of the database's
    clock. Leases are written and judged on that clock (DatabaseClock), whatever the nodes'
    own clocks say. Each run reaped gets the next lease epoch, so whatever its old attempt
    still writes is refused.

    With `own_node_restart`, runs this node id held before a restart are reaped at once:
    the process that held them is gone. Returns how many runs were reaped.
    """
    live = live or {}
    clock = database_clock(ctx.engine)
    # Judged by a time never later than the database's; written with one never earlier.
    judged, now = clock.earliest(), clock.now()
    cond = col(Run.lease_expires_at) < judged - timedelta(seconds=ctx.settings.lease_grace_seconds)
    if own_node_restart:
        cond = or_(cond, col(Run.lease_owner) == ctx.node_id)
    with session_scope(ctx.engine, write=True) as s:
        rows = s.exec(
            select(Run).where(Run.status == RUNNING, cond).with_for_update(skip_locked=True)
        ).all()
        renewed = clock.now() + timedelta(seconds=ctx.settings.lease_seconds)
        reaped = 0
        for run in rows:
            if run.lease_owner == ctx.node_id and live.get(run.id) == run.attempt:
                run.lease_expires_at = renewed
                s.add(run)
                continue
            reaped += 1
            run.lease_epoch += 1  # the old attempt is fenced from here on
            lost = f"executor {run.lease_owner} stopped (lease expired)"
            if run.cancel_requested:
                transition(
                    run,
                    CANCELLED,
                    by=REAPER,
                    now=now,
                    error_code=RunErrorCode.CANCELLED,
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
        if reaped:
            signals.publish(s, signals.RUN_QUEUED)
    if reaped:
        ctx.node.run_queued()
    return reaped
