"""An attempt's end against what changed while it ran: a cancel asked for meanwhile is kept
even when the attempt ends in a retry, and a run of a worker deleted meanwhile writes no
state into the worker deployed again under its name. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete
from sqlmodel import col, select

from floom.engine.queue import (
    Outcome,
    StateChange,
    claim_next_run,
    finish_attempt,
    reap_expired_leases,
)
from floom.errors import Conflict, RunErrorCode
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.workers import state as worker_state
from floom.store.agents import MemoryEntry
from floom.store.db import session_scope
from floom.store.models import Run, Worker, WorkerState, utcnow
from floom.vocabulary import RunStatus
from tests.support.rigs.queues import enqueue


def _row(ctx: Context, run_id: str) -> Run:
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
    assert row is not None
    return row


def _deploy(ctx: Context) -> None:
    """A worker "w" (the queue rig's runs are of it), as a deploy leaves it."""
    with session_scope(ctx.engine, write=True) as s:
        s.add(Worker(name="w"))


def _states(ctx: Context) -> tuple[int, list[int]]:
    with session_scope(ctx.engine) as s:
        worker = s.get(Worker, "w")
        assert worker is not None
        kept = list(s.exec(select(WorkerState.version).where(WorkerState.worker_name == "w")))
    return worker.state_version, kept


def test_a_cancel_asked_during_an_attempt_that_ends_in_a_retry_ends_the_run(
    ctx: Context,
) -> None:
    (run_id,) = enqueue(ctx, 1, max_attempts=3)
    run = claim_next_run(ctx)
    assert run is not None
    runs.cancel_run(ctx, run_id=run_id, caller=SYSTEM)

    # The attempt ended (a retryable failure) before its executor saw the cancel.
    failed = Outcome(
        status=RunStatus.FAILED, error_code=RunErrorCode.WORKER_ERROR, error_message="boom"
    )
    status = finish_attempt(ctx, run=run, outcome=failed, backoff=0)

    assert status == "cancelled"
    row = _row(ctx, run_id)
    assert (row.status, row.attempt) == ("cancelled", 1)
    assert claim_next_run(ctx) is None  # it is not run again


def test_a_run_of_a_deleted_worker_writes_no_state_into_the_one_deployed_again(
    ctx: Context,
) -> None:
    _deploy(ctx)
    (run_id,) = enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    base = worker_state.base_of_run(ctx, run=run)  # as its attempt starts
    # Deleted while the run runs (it is asked to stop), then deployed again: version 0 too.
    runs.cancel_run(ctx, run_id=run_id, caller=SYSTEM)
    with session_scope(ctx.engine, write=True) as s:
        s.delete(s.get(Worker, "w"))
    _deploy(ctx)

    change = StateChange(base=base.version, new_json='{"from":"old"}', owner=base.owner)
    ended = Outcome(status=RunStatus.SUCCEEDED, outputs={}, state=change)
    status = finish_attempt(ctx, run=run, outcome=ended, backoff=0)

    assert status == "failed"
    assert _row(ctx, run_id).error_code == "state_conflict"
    assert _states(ctx) == (0, [])


def test_a_run_of_the_worker_it_started_under_writes_its_state(ctx: Context) -> None:
    _deploy(ctx)
    enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    base = worker_state.base_of_run(ctx, run=run)

    change = StateChange(base=base.version, new_json='{"n":1}', owner=base.owner)
    ended = Outcome(status=RunStatus.SUCCEEDED, outputs={}, state=change)

    assert finish_attempt(ctx, run=run, outcome=ended, backoff=0) == "succeeded"
    assert _states(ctx) == (1, [1])


def test_a_run_of_a_deleted_worker_neither_writes_nor_reads_the_memory_of_the_one_deployed_again(
    ctx: Context,
) -> None:
    """An agent run's `remember` and `recall`, in the moments before it sees that its worker
    was deleted: before, it wrote into (and read) the memory of the worker deployed again."""
    _deploy(ctx)
    (run_id,) = enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    held = run.lease_epoch
    agent_runs.remember(
        ctx, worker_name="w", key="k", value="mine", run_id=run_id, lease_epoch=held
    )
    assert agent_runs.recall(ctx, worker_name="w", key="k", run_id=run_id, lease_epoch=held) == (
        "mine",
        run_id,
    )
    # Deleted while the run runs (it is asked to stop first), then deployed again.
    runs.cancel_run(ctx, run_id=run_id, caller=SYSTEM)
    with session_scope(ctx.engine, write=True) as s:
        s.execute(delete(MemoryEntry).where(col(MemoryEntry.worker_name) == "w"))
        s.delete(s.get(Worker, "w"))
    _deploy(ctx)

    with pytest.raises(Conflict, match="being stopped"):
        agent_runs.remember(
            ctx, worker_name="w", key="k", value="stale", run_id=run_id, lease_epoch=held
        )
    with pytest.raises(Conflict, match="being stopped"):
        agent_runs.recall(ctx, worker_name="w", key="k", run_id=run_id, lease_epoch=held)
    with pytest.raises(Conflict, match="being stopped"):
        agent_runs.memory_keys(ctx, worker_name="w", run_id=run_id, lease_epoch=held)
    assert agent_runs.memory_writes(ctx, worker_name="w") == []


def test_an_attempt_whose_lease_was_lost_neither_writes_nor_reads_the_memory(
    ctx: Context,
) -> None:
    """An agent attempt on a node that lost its lease (frozen, cut off) still runs until it
    sees that; meanwhile the run was reaped and claimed again, and is running once more. Its
    `remember` must not land beside the new attempt's, nor its `recall` read them."""
    _deploy(ctx)
    (run_id,) = enqueue(ctx, 1, max_attempts=3)
    old = claim_next_run(ctx)
    assert old is not None
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(minutes=5)
        s.add(row)
    assert reap_expired_leases(ctx) == 1
    new = claim_next_run(ctx)
    assert new is not None
    assert (new.id, new.attempt) == (run_id, 2)

    stale, current = old.lease_epoch, new.lease_epoch
    with pytest.raises(Conflict, match="no longer holds its lease"):
        agent_runs.remember(
            ctx, worker_name="w", key="k", value="stale", run_id=run_id, lease_epoch=stale
        )
    agent_runs.remember(
        ctx, worker_name="w", key="k", value="current", run_id=run_id, lease_epoch=current
    )
    with pytest.raises(Conflict, match="no longer holds its lease"):
        agent_runs.recall(ctx, worker_name="w", key="k", run_id=run_id, lease_epoch=stale)
    with pytest.raises(Conflict, match="no longer holds its lease"):
        agent_runs.memory_keys(ctx, worker_name="w", run_id=run_id, lease_epoch=stale)
    assert agent_runs.recall(ctx, worker_name="w", key="k", run_id=run_id, lease_epoch=current) == (
        "current",
        run_id,
    )
    assert [w["value"] for w in agent_runs.memory_writes(ctx, worker_name="w")] == ["current"]
