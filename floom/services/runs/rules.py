"""The run state machine: the one transition table that every writer of a run's status goes
through (the statuses and their sets live in floom/services/runs/statuses.py and are importable from
here).

Plain data and attribute writes, no store imports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from floom.cut import cut
from floom.errors import IllegalTransition, InvalidRequest, RunErrorCode

# Re-exported on purpose ("X as X"): callers read the statuses and their sets from the state
# machine, the one place a run's status is decided.
from floom.services.runs.statuses import ACTIVE as ACTIVE
from floom.services.runs.statuses import ATTEMPT_ENDS as ATTEMPT_ENDS
from floom.services.runs.statuses import AWAITING_APPROVAL as AWAITING_APPROVAL
from floom.services.runs.statuses import CANCELLED as CANCELLED
from floom.services.runs.statuses import FAILED as FAILED
from floom.services.runs.statuses import FINISHED as FINISHED
from floom.services.runs.statuses import INITIAL as INITIAL
from floom.services.runs.statuses import LIMIT_EXCEEDED as LIMIT_EXCEEDED
from floom.services.runs.statuses import QUEUED as QUEUED
from floom.services.runs.statuses import REJECTED as REJECTED
from floom.services.runs.statuses import RETRYABLE as RETRYABLE
from floom.services.runs.statuses import RUNNING as RUNNING
from floom.services.runs.statuses import SKIPPED as SKIPPED
from floom.services.runs.statuses import STATUSES as STATUSES
from floom.services.runs.statuses import SUCCEEDED as SUCCEEDED
from floom.services.runs.statuses import TIMED_OUT as TIMED_OUT
from floom.services.runs.statuses import WAITING as WAITING
from floom.vocabulary import PreviousAttempt, RunStatus

if TYPE_CHECKING:
    from floom.store.models import Run

MAX_ERROR_CHARS = 16 * 1024
"""The most of a run's error message kept (as of a stored log line or tool-call result): it
may carry what a worker wrote (result.json's `error`, a line of its stderr), and it is shown
in every list of runs, every alert and the run's closing log line."""
ERROR_CUT_MARKER = f" [error message cut at {MAX_ERROR_CHARS} characters]"


def kept_error(message: str | None) -> str | None:
    """A run's error message as kept: at most MAX_ERROR_CHARS characters, marked when cut."""
    if message is None:
        return None
    return cut(message, MAX_ERROR_CHARS, marker=ERROR_CUT_MARKER)


# Who makes a move.
EXECUTOR = "executor"  # the node holding the run's lease (or claiming it)
REAPER = "reaper"  # floom itself, for a node whose lease expired
CALLER = "caller"  # a person or client through REST, MCP, the UI or the CLI
ACTORS = (EXECUTOR, REAPER, CALLER)

# The one table of allowed status changes and who may make each.
TRANSITIONS: dict[RunStatus, dict[RunStatus, frozenset[str]]] = {
    QUEUED: {
        RUNNING: frozenset({EXECUTOR}),  # claimed
        CANCELLED: frozenset({CALLER}),  # cancelled before it started
    },
    RUNNING: {
        SUCCEEDED: frozenset({EXECUTOR}),
        FAILED: frozenset({EXECUTOR, REAPER}),  # the reaper: lease lost, no attempts left
        TIMED_OUT: frozenset({EXECUTOR}),
        CANCELLED: frozenset({EXECUTOR, REAPER}),  # a caller only asks (cancel_requested)
        LIMIT_EXCEEDED: frozenset({EXECUTOR}),
        AWAITING_APPROVAL: frozenset({EXECUTOR}),  # paused for a person
        QUEUED: frozenset({EXECUTOR, REAPER}),  # the next attempt: retry, shutdown, lost lease
    },
    AWAITING_APPROVAL: {
        QUEUED: frozenset({CALLER}),  # decided: the apply or resume phase is queued
        REJECTED: frozenset({CALLER}),  # a run-level rejection
        CANCELLED: frozenset({CALLER}),
    },
    SUCCEEDED: {},
    FAILED: {},
    TIMED_OUT: {},
    CANCELLED: {},
    REJECTED: {},
    LIMIT_EXCEEDED: {},
    SKIPPED: {},
}

_WHO = {
    EXECUTOR: "the executor holding the run",
    REAPER: "floom's reaper (after a lost lease)",
    CALLER: "a caller (cancel, or an approval decision)",
}


def allowed_targets(status: RunStatus, *, by: str) -> list[RunStatus]:
    """The statuses `by` may move a run in `status` to, in table order."""
    return [to for to, who in TRANSITIONS.get(status, {}).items() if by in who]


def check_transition(current: RunStatus, to: RunStatus, *, by: str) -> None:
    """Refuse a move the table does not allow `by` to make, naming the allowed ones."""
    if to not in TRANSITIONS:
        raise InvalidRequest(f"unknown run status '{to}'", hint=f"one of {', '.join(STATUSES)}")
    if by not in ACTORS:
        raise InvalidRequest(f"unknown actor '{by}'", hint=f"one of {', '.join(ACTORS)}")
    who = TRANSITIONS.get(current, {}).get(to)
    if who is not None and by in who:
        return
    allowed = allowed_targets(current, by=by)
    if current in FINISHED:
        hint = f"{current} is final; replay the run to run it again"
    elif who is not None:
        hint = "only " + " or ".join(_WHO[w] for w in sorted(who)) + " makes this move"
    elif allowed:
        hint = f"from {current} it can move to {', '.join(allowed)}"
    else:
        hint = f"{_WHO[by]} cannot move a {current} run"
    raise IllegalTransition(
        f"a {current} run cannot move to {to}",
        hint=hint,
        details={"from": current, "to": to, "by": by, "allowed": allowed},
    )


def transition(
    run: Run | RunFields,
    to: RunStatus,
    *,
    by: str,
    now: datetime | None = None,
    error_code: RunErrorCode | None = None,
    error_message: str | None = None,
) -> None:
    """Move `run` to `to` with the fields that go with it, or raise IllegalTransition.

    Leaving running releases the lease; a queued run has not started; a finished one gets
    its end time and its error (None clears an earlier attempt's). The caller holds the row
    lock and writes the run.
    """
    check_transition(run.status, to, by=by)
    run.status = to
    if to != RUNNING:
        run.lease_owner = None
        run.lease_expires_at = None
    if to == QUEUED:
        run.started_at = None
        run.not_before = None
    elif to in FINISHED:
        run.finished_at = now or datetime.now(UTC)
        run.error_code = error_code
        run.error_message = kept_error(error_message)


def claimed_fields(*, node_id: str, lease_seconds: float, now: datetime) -> dict[str, Any]:
    """The fields a queued run gets when this node takes it: running, under a lease the node
    renews. The queue's claim writes them in its one UPDATE; `mark_claimed` sets them on a
    run in hand."""
    return {
        "status": RUNNING,
        "lease_owner": node_id,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "started_at": now,
        "cancel_requested": False,
    }


def started_message(run: Run, *, node_id: str) -> str:
    """The log line of a claim: which attempt of how many, on which node."""
    return f"started attempt {run.attempt} of {run.max_attempts} on {node_id}"


def mark_claimed(run: Run, *, node_id: str, lease_seconds: float, now: datetime) -> None:
    """A queued run taken by this node: running, under a lease the node renews, with the
    next lease epoch (its attempt's fencing token; the queue's claim adds one in SQL)."""
    check_transition(run.status, RUNNING, by=EXECUTOR)
    for name, value in claimed_fields(
        node_id=node_id, lease_seconds=lease_seconds, now=now
    ).items():
        setattr(run, name, value)
    run.lease_epoch = (run.lease_epoch or 0) + 1


@dataclass
class RunFields:
    """The fields of a run that the rules read and write, detached from its row: a writer
    that applies the rules to a copy and writes the result in one statement (the queue's
    attempt end) starts from `RunFields.of(run)`."""

    status: RunStatus
    lease_owner: str | None
    lease_expires_at: datetime | None
    started_at: datetime | None
    not_before: datetime | None
    finished_at: datetime | None
    error_code: RunErrorCode | None
    error_message: str | None
    attempt: int
    max_attempts: int
    previous_attempt: PreviousAttempt | None

    @classmethod
    def of(cls, run: Run) -> RunFields:
        return cls(**{name: getattr(run, name) for name in RULE_FIELDS})


RULE_FIELDS = tuple(f.name for f in fields(RunFields))


def requeue_next_attempt(
    run: Run | RunFields,
    *,
    by: str,
    now: datetime | None = None,
    delay_seconds: float | None = None,
    counts_as_attempt: bool = True,
    ended: RunErrorCode,
) -> None:
    """Queue a running run again as its next attempt, lease released.

    `delay_seconds` holds it back (a retry's backoff). An attempt that did not count (the
    node shut down under it) is given back, so it costs the worker none of its retries.
    `ended` says how the attempt that stops here ended (INTERRUPTED, EXECUTOR_LOST, or the
    failure's error code); the queued run keeps it as its error code until its next attempt
    ends, and as `previous_attempt` for good, which the next attempt's script sees.
    """
    transition(run, QUEUED, by=by)
    run.error_code = ended
    run.previous_attempt = _PREVIOUS.get(ended, PreviousAttempt.FAILED)
    run.attempt += 1
    if not counts_as_attempt:
        run.max_attempts += 1
    if delay_seconds is not None:
        run.not_before = (now or datetime.now(UTC)) + timedelta(seconds=delay_seconds)


# How an attempt that was followed by another one ended (its error code), as the run keeps it
# in `previous_attempt` and the script of the next one sees it in $FLOOM_PREVIOUS_ATTEMPT.
INTERRUPTED = RunErrorCode.INTERRUPTED
EXECUTOR_LOST = RunErrorCode.EXECUTOR_LOST
_PREVIOUS = {INTERRUPTED: PreviousAttempt.INTERRUPTED, EXECUTOR_LOST: PreviousAttempt.LOST}


def previous_attempt(run: Run) -> PreviousAttempt | None:
    """How the attempt before this one ended: `interrupted` (its node shut down while it
    ran), `lost` (its node died or stopped renewing its lease), `failed` (it failed and is
    retried), or None on a first attempt. A worker with side effects checks it to avoid
    doing them twice."""
    return run.previous_attempt if run.attempt > 1 else None
