"""A run's statuses (floom.vocabulary.RunStatus) and the sets callers test them against, with
no other import: read without loading the state machine (floom/services/runs/rules.py, whose
dataclasses cost the CLI about 18 ms of CPU per call)."""

from __future__ import annotations

from floom.vocabulary import RunStatus

QUEUED = RunStatus.QUEUED
RUNNING = RunStatus.RUNNING
# Waiting for a person (floom/services/runs/approvals.py); holds no executor slot meanwhile.
AWAITING_APPROVAL = RunStatus.AWAITING_APPROVAL
SUCCEEDED = RunStatus.SUCCEEDED
FAILED = RunStatus.FAILED
TIMED_OUT = RunStatus.TIMED_OUT
CANCELLED = RunStatus.CANCELLED
REJECTED = RunStatus.REJECTED
LIMIT_EXCEEDED = RunStatus.LIMIT_EXCEEDED
# A trigger's tick or event that did not become a run (overlap, missed, paused, bad input);
# the error says why. Born finished: it never runs.
SKIPPED = RunStatus.SKIPPED
STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)
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
