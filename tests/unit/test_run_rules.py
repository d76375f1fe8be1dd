"""The run state machine: the transition table walked move by move, and what each move writes."""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest

from floom.errors import IllegalTransition, InvalidRequest, RunErrorCode
from floom.services.runs import rules
from floom.services.runs.rules import (
    ACTORS,
    STATUSES,
    TRANSITIONS,
    allowed_targets,
    mark_claimed,
    requeue_next_attempt,
    transition,
)
from floom.services.runs.statuses import FINISHED as TERMINAL_STATUSES
from floom.store.models import Run
from floom.vocabulary import RunStatus

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MOVES = [(src, to, by) for src in STATUSES for to in STATUSES for by in ACTORS]


def a_run(status: RunStatus, **fields: object) -> Run:
    run = Run(id="run_1", worker_name="w", version_id="v", status=status)
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def test_every_status_has_a_row_and_finished_statuses_have_no_moves() -> None:
    assert set(TRANSITIONS) == set(STATUSES)
    for status in rules.FINISHED:
        assert TRANSITIONS[status] == {}
    for moves in TRANSITIONS.values():
        assert set(moves) <= set(STATUSES)
        for who in moves.values():
            assert who
            assert who <= set(ACTORS)


def test_every_status_is_exactly_one_of_active_waiting_or_finished() -> None:
    groups = (rules.ACTIVE, rules.WAITING, rules.FINISHED)
    assert sum(len(g) for g in groups) == len(STATUSES)
    assert set().union(*groups) == set(STATUSES)
    assert set(STATUSES) >= rules.INITIAL
    assert rules.RETRYABLE <= rules.ATTEMPT_ENDS <= set(TRANSITIONS[rules.RUNNING])


def test_only_a_move_with_no_way_out_is_a_finished_status() -> None:
    for status in STATUSES:
        assert (TRANSITIONS[status] == {}) == (status in rules.FINISHED)


@pytest.mark.parametrize(
    ("src", "to", "by"), [m for m in MOVES if m[2] in TRANSITIONS[m[0]].get(m[1], ())]
)
def test_every_move_the_table_allows_succeeds_through_transition(
    src: RunStatus, to: RunStatus, by: str
) -> None:
    run = a_run(src, lease_owner="node-a", lease_expires_at=NOW)
    transition(run, to, by=by, now=NOW)
    assert run.status == to


def test_every_move_the_table_does_not_allow_raises_with_the_allowed_ones() -> None:
    refused = 0
    for src, to, by in MOVES:
        if by in TRANSITIONS[src].get(to, ()):
            continue
        run = a_run(src, lease_owner="node-a")
        with pytest.raises(IllegalTransition) as info:
            transition(run, to, by=by, now=NOW)
        error = info.value
        assert (error.status, error.code) == (409, "illegal_transition")
        assert error.details == {
            "from": src,
            "to": to,
            "by": by,
            "allowed": allowed_targets(src, by=by),
        }
        assert error.hint
        # Refused means unchanged.
        assert (run.status, run.lease_owner) == (src, "node-a")
        refused += 1
    allowed = sum(len(who) for moves in TRANSITIONS.values() for who in moves.values())
    assert refused == len(MOVES) - allowed


def test_a_caller_cannot_end_a_running_run_it_can_only_ask() -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(a_run(rules.RUNNING), rules.CANCELLED, by=rules.CALLER)
    assert info.value.details["allowed"] == []
    assert "executor" in (info.value.hint or "")


def test_a_finished_run_points_at_a_replay() -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(a_run(rules.SUCCEEDED), rules.QUEUED, by=rules.CALLER)
    assert "replay" in (info.value.hint or "")


def test_an_unknown_status_or_actor_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        # A word from outside the set, as an untyped caller could pass one.
        transition(a_run(rules.QUEUED), cast(RunStatus, "done"), by=rules.EXECUTOR)
    with pytest.raises(InvalidRequest):
        transition(a_run(rules.QUEUED), rules.RUNNING, by="somebody")


def test_a_finished_move_stamps_the_end_and_replaces_the_error_and_releases_the_lease() -> None:
    run = a_run(
        rules.RUNNING,
        lease_owner="node-a",
        lease_expires_at=NOW,
        error_code="worker_error",
        error_message="attempt 1 failed",
    )
    transition(run, rules.SUCCEEDED, by=rules.EXECUTOR, now=NOW)
    assert (run.finished_at, run.error_code, run.error_message) == (NOW, None, None)
    assert (run.lease_owner, run.lease_expires_at) == (None, None)


def test_pausing_for_approval_releases_the_lease_but_does_not_end_the_run() -> None:
    run = a_run(rules.RUNNING, lease_owner="node-a", lease_expires_at=NOW, started_at=NOW)
    transition(run, rules.AWAITING_APPROVAL, by=rules.EXECUTOR)
    assert (run.lease_owner, run.lease_expires_at, run.finished_at) == (None, None, None)
    assert run.started_at == NOW


def test_mark_claimed_takes_a_lease_and_forgets_an_old_cancel_request() -> None:
    run = a_run(rules.QUEUED, cancel_requested=True)
    mark_claimed(run, node_id="node-a", lease_seconds=30, now=NOW)
    assert run.status == rules.RUNNING
    assert (run.lease_owner, run.lease_expires_at) == ("node-a", NOW + timedelta(seconds=30))
    assert (run.started_at, run.cancel_requested) == (NOW, False)


def test_mark_claimed_refuses_a_run_that_is_not_queued() -> None:
    run = a_run(rules.AWAITING_APPROVAL)
    with pytest.raises(IllegalTransition):
        mark_claimed(run, node_id="node-a", lease_seconds=30, now=NOW)
    assert (run.status, run.lease_owner) == (rules.AWAITING_APPROVAL, None)


def test_requeue_next_attempt_increments_the_attempt_and_clears_the_lease() -> None:
    run = a_run(
        rules.RUNNING,
        attempt=1,
        max_attempts=3,
        lease_owner="node-a",
        lease_expires_at=NOW,
        started_at=NOW,
    )
    requeue_next_attempt(run, by=rules.REAPER, now=NOW, ended=rules.EXECUTOR_LOST)
    assert (run.status, run.attempt, run.max_attempts) == (rules.QUEUED, 2, 3)
    assert rules.previous_attempt(run) == "lost"
    assert (run.lease_owner, run.lease_expires_at, run.started_at, run.not_before) == (
        None,
        None,
        None,
        None,
    )


def test_a_retry_waits_out_its_backoff_and_an_interruption_costs_no_attempt() -> None:
    retry = a_run(rules.RUNNING, attempt=2, max_attempts=3)
    requeue_next_attempt(
        retry, by=rules.EXECUTOR, now=NOW, delay_seconds=8, ended=RunErrorCode.TIMED_OUT
    )
    assert (retry.attempt, retry.not_before) == (3, NOW + timedelta(seconds=8))
    assert rules.previous_attempt(retry) == "failed"

    interrupted = a_run(rules.RUNNING, attempt=1, max_attempts=1)
    requeue_next_attempt(
        interrupted, by=rules.EXECUTOR, counts_as_attempt=False, ended=rules.INTERRUPTED
    )
    assert (interrupted.attempt, interrupted.max_attempts) == (2, 2)
    assert rules.previous_attempt(interrupted) == "interrupted"


def test_requeue_refuses_a_run_that_is_not_running() -> None:
    run = a_run(rules.CANCELLED, attempt=1)
    with pytest.raises(IllegalTransition):
        requeue_next_attempt(run, by=rules.REAPER, ended=rules.EXECUTOR_LOST)
    assert (run.status, run.attempt) == (rules.CANCELLED, 1)


def test_the_client_uses_the_one_finished_set_and_loads_no_store_to_get_it() -> None:
    assert TERMINAL_STATUSES is rules.FINISHED
    probe = (
        "import sys, floom.client.rest; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == "[]"


FLOOM = Path(__file__).resolve().parents[2] / "floom"
# Every `X.status = ...` in floom outside run_rules, with what X is: none of them is a run's.
OTHER_STATUS_WRITES = {
    ("errors.py", "self.status"),  # an error's HTTP status
    ("services/runs/agent.py", "call.status"),  # a tool call
    ("services/runs/approvals.py", "approval.status"),
    ("services/runs/approvals.py", "call.status"),  # a tool call withdrawn with its approval
    ("services/handoffs/jobs.py", "job.status"),  # handoff jobs have their own table
    ("services/handoffs/flow.py", "job.status"),
    ("services/alerts/deliveries.py", "delivery.status"),  # an alert's delivery
    ("views/triggers.py", "answer.status"),  # a webhook's answer to its sender
    # The queue's detached copy of the run starts from the status its conditional UPDATE
    # matches; the move itself goes through transition or requeue_next_attempt.
    ("engine/queue.py", "ended.status"),
}
# A run is created in an initial status (queued, or skipped by a trigger) only here.
RUN_CREATORS = {"services/runs/lifecycle.py"}


def _status_writes() -> tuple[set[tuple[str, str]], set[str]]:
    writes: set[tuple[str, str]] = set()
    creators: set[str] = set()
    for path in FLOOM.rglob("*.py"):
        if (
            "migrations" in path.parts
            or path.relative_to(FLOOM).as_posix() == "services/runs/rules.py"
        ):
            continue
        rel = path.relative_to(FLOOM).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            writes.update(
                (rel, ast.unparse(t))
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr == "status"
            )
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name == "setattr" and any(
                    isinstance(a, ast.Constant) and a.value == "status" for a in node.args
                ):
                    writes.add((rel, ast.unparse(node)))
                makes_run = name == "Run" or (
                    name == "trusted_row" and node.args and ast.unparse(node.args[0]) == "Run"
                )
                keys = [k.arg for k in node.keywords] + [
                    k.value
                    for a in node.args
                    if isinstance(a, ast.Dict)
                    for k in a.keys
                    if isinstance(k, ast.Constant)
                ]
                if makes_run and "status" in keys:
                    creators.add(rel)
    return writes, creators


def test_every_writer_of_a_runs_status_goes_through_the_state_machine() -> None:
    writes, creators = _status_writes()
    unlisted = writes - OTHER_STATUS_WRITES
    assert not unlisted, (
        "a run's status changes only through run_rules (transition, requeue_next_attempt, "
        f"mark_claimed); if this is not a run, list it with what it is: {unlisted}"
    )
    assert creators <= RUN_CREATORS, f"runs are created with a status only in {RUN_CREATORS}"
    # The scan sees what it looks for.
    assert ("services/runs/approvals.py", "approval.status") in writes
    assert creators
