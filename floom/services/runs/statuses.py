"""A run's statuses and the sets callers test them against, with no imports at all: the
client and the CLI's quick path read them without loading the state machine
(floom/services/runs/rules.py, whose dataclasses cost the CLI about 18 ms of CPU per call)."""

from __future__ import annotations

QUEUED = "queued"
RUNNING = "running"
# Waiting for a person (floom/services/runs/approvals.py); holds no executor slot meanwhile.
AWAITING_APPROVAL = "awaiting_approval"
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
REJECTED = "rejected"
LIMIT_EXCEEDED = "limit_exceeded"
# A trigger's tick or event that did not become a run (overlap, missed, paused, bad input);
# the error says why. Born finished: it never runs.
SKIPPED = "skipped"
STATUSES = (
    QUEUED,
    RUNNING,
    AWAITING_APPROVAL,
    SUCCEEDED,
    FAILED,
    TIMED_OUT,
    CANCELLED,
    REJECTED,
    LIMIT_EXCEEDED,
    SKIPPED,
)
# Ended for good: nothing moves the run again (a replay is a new run).
FINISHED = frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, REJECTED, LIMIT_EXCEEDED, SKIPPED})
# Moves on by itself: waiting for an executor slot, or holding one.
ACTIVE = frozenset({QUEUED, RUNNING})
# Neither active nor finished: stays until a person decides (or cancels).
WAITING = frozenset({AWAITING_APPROVAL})
# The statuses a run is inserted with.
INITIAL = frozenset({QUEUED, SKIPPED})
# How the executor may judge an attempt that ran to its end.
ATTEMPT_ENDS = frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, LIMIT_EXCEEDED})
# Attempt ends that the manifest's retry policy may turn into another attempt.
RETRYABLE = frozenset({FAILED, TIMED_OUT})
