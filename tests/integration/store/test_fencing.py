"""Each claim and each reap gives a run the next lease epoch, and every write of an attempt
presents the epoch it was claimed with: a fenced (older) attempt's end, log lines, pause and
lease renewal are refused and change nothing, on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlmodel import select

from floom.engine.queue import (
    Outcome,
    claim_next_run,
    finish_attempt,
    reap_expired_leases,
    renew_held_leases,
)
from floom.engine.runlog import RunLog
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from floom.services.context import Context
from floom.services.runs.approvals import new_approval, pause_run
from floom.services.runs.logs import list_events
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.store.models import Artifact, Run, utcnow
from floom.vocabulary import ApprovalKind, RunStatus
from tests.support.rigs.queues import enqueue, other_node


def _row(ctx: Context, run_id: str) -> Run:
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
    assert row is not None
    return row


def _fenced_attempt(ctx: Context) -> tuple[Run, Run, Context]:
    """Attempt 1 claimed here, its lease lapsed and reaped; attempt 2 running on node B."""
    (run_id,) = enqueue(ctx, 1, max_attempts=3)
    first = claim_next_run(ctx)
    assert first is not None
    assert first.lease_epoch == 1
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=5)
        s.add(row)
    b = other_node(ctx, "node-b")
    assert reap_expired_leases(b) == 1
    assert _row(ctx, run_id).lease_epoch == 2  # the reap alone fences attempt 1
    second = claim_next_run(b)
    assert second is not None
    assert (second.attempt, second.lease_epoch) == (2, 3)
    return first, second, b


def _state(ctx: Context, run_id: str) -> tuple[object, ...]:
    row = _row(ctx, run_id)
    with session_scope(ctx.engine) as s:
        artifacts = len(s.exec(select(Artifact).where(Artifact.run_id == run_id)).all())
        approvals = len(s.exec(select(Approval).where(Approval.run_id == run_id)).all())
    events = [(e.seq, e.line) for e in list_events(ctx, run_id=run_id, caller=SYSTEM)]
    return (
        row.status,
        row.attempt,
        row.lease_owner,
        row.lease_epoch,
        row.lease_expires_at,
        row.outputs_json,
        row.sandbox_seconds,
        artifacts,
        approvals,
        events,
    )


def test_a_fenced_attempt_s_late_end_is_refused_and_changes_nothing(
    ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    first, second, b = _fenced_attempt(ctx)
    before = _state(ctx, first.id)
    caplog.set_level(logging.WARNING, logger="floom.executor")
    late = Outcome(
        status=RunStatus.SUCCEEDED,
        outputs={"late": True},
        sandbox_seconds=9.0,
        artifacts=[("late.txt", b"late", "text/plain")],
    )
    status = finish_attempt(
        ctx, run=first, outcome=late, backoff=0, log_lines=[("stdout", "late line", None)]
    )
    assert status == "running"
    assert _state(ctx, first.id) == before
    assert f"run {first.id} attempt 1 is fenced" in caplog.text
    assert "late end and 1 log line(s) were refused" in caplog.text
    # The attempt that holds the run ends it as usual.
    done = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})
    assert finish_attempt(b, run=second, outcome=done, backoff=0) == "succeeded"


def test_a_fenced_attempt_s_log_lines_are_refused(
    ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    first, second, _ = _fenced_attempt(ctx)
    before = _state(ctx, first.id)
    caplog.set_level(logging.WARNING, logger="floom.executor")
    stale = RunLog(
        run_id=first.id,
        attempt=1,
        redactor=Redactor([]),
        max_lines=100,
        max_bytes=10_000,
        epoch=first.lease_epoch,
    )
    stale.add("stdout", "late line")
    stale.flush(ctx)
    stale.add("stdout", "later line")
    stale.flush(ctx)
    assert _state(ctx, first.id) == before
    assert "its late log lines were refused" in caplog.text
    # The current attempt's lines are written.
    current = RunLog(
        run_id=first.id,
        attempt=2,
        redactor=Redactor([]),
        max_lines=100,
        max_bytes=10_000,
        epoch=second.lease_epoch,
    )
    current.add("stdout", "line of attempt 2")
    current.flush(ctx)
    lines = [e.line for e in list_events(ctx, run_id=first.id, caller=SYSTEM)]
    assert lines[-1] == "line of attempt 2"


def test_a_fenced_attempt_cannot_pause_the_run_nor_renew_its_lease(ctx: Context) -> None:
    first, second, b = _fenced_attempt(ctx)
    # Same node, same owner: only the epoch tells the attempts apart.
    b_first = first.model_copy(update={"lease_owner": "node-b"})
    before = _state(ctx, first.id)
    approval = new_approval(run=second, kind=ApprovalKind.RUN, proposed={"x": 1})
    assert not pause_run(b, run=b_first, approval=approval, proposed_outputs={"x": 1})
    renewal = renew_held_leases(b, {first.id: first.lease_epoch})
    assert (renewal.renewed, renewal.lost) == (set(), {first.id})
    assert _state(ctx, first.id) == before
    renewal = renew_held_leases(b, {first.id: second.lease_epoch})
    assert (renewal.renewed, renewal.lost) == ({first.id}, set())


def test_every_claim_and_reap_moves_the_epoch_on(ctx: Context) -> None:
    (run_id,) = enqueue(ctx, 1, max_attempts=2)
    assert _row(ctx, run_id).lease_epoch == 0
    claimed = claim_next_run(ctx)
    assert claimed is not None
    assert claimed.lease_epoch == 1 == _row(ctx, run_id).lease_epoch
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=5)
        s.add(row)
    assert reap_expired_leases(other_node(ctx, "node-b")) == 1
    assert _row(ctx, run_id).lease_epoch == 2


def test_the_reaper_takes_an_expired_lease_only_after_its_grace(ctx: Context) -> None:
    (run_id,) = enqueue(ctx, 1, max_attempts=2)
    assert claim_next_run(ctx) is not None
    b = other_node(ctx, "node-b")
    b.settings = b.settings.model_copy(update={"lease_grace_seconds": 30.0})

    def expired(seconds_ago: float) -> None:
        with session_scope(ctx.engine, write=True) as s:
            row = s.get(Run, run_id)
            assert row is not None
            row.lease_expires_at = utcnow() - timedelta(seconds=seconds_ago)
            s.add(row)

    # Expired, but the holder's watchdog may still be ending its sandbox: not yet.
    expired(20)
    assert reap_expired_leases(b) == 0
    assert _row(ctx, run_id).status == "running"
    expired(31)
    assert reap_expired_leases(b) == 1
    assert _row(ctx, run_id).status == "queued"
