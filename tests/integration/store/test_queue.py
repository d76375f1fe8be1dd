"""The runs table as a queue: atomic claims across nodes, leases, the reaper."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from floom.engine import queue as queue_module
from floom.engine.phases import claim_run
from floom.engine.queue import (
    Claim,
    NextClaim,
    Outcome,
    claim_next,
    claim_next_run,
    finish_attempt,
    reap_expired_leases,
    renew_leases,
)
from floom.errors import RunErrorCode
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.logs import list_events
from floom.store.db import session_scope
from floom.store.models import Run, utcnow
from floom.vocabulary import RunStatus
from tests.support.rigs.queues import commits, enqueue, is_claim, is_end, other_node


def test_racing_nodes_never_claim_the_same_run(ctx: Context) -> None:
    ids = enqueue(ctx, 60)
    nodes = [ctx, other_node(ctx, "node-b"), other_node(ctx, "node-c")]
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(9)

    def worker(node: Context) -> None:
        start.wait(timeout=10)
        while True:
            run = claim_next_run(node)
            if run is None:
                return
            with lock:
                claimed.append((run.id, node.node_id))
            # A node starts the run it claimed before it claims again: without this pause one
            # thread could take SQLite's write lock for every claim, and no race happen.
            time.sleep(0.002)

    threads = [threading.Thread(target=worker, args=(n,)) for n in nodes for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(run_id for run_id, _ in claimed) == sorted(ids)
    assert len({node for _, node in claimed}) >= 2
    with session_scope(ctx.engine) as s:
        for run_id, node in claimed:
            row = s.get(Run, run_id)
            assert row is not None
            assert (row.status, row.lease_owner) == ("running", node)
    for n in nodes[1:]:
        n.engine.dispose()


def test_claims_take_the_oldest_first_and_respect_not_before(ctx: Context) -> None:
    later = enqueue(ctx, 1, not_before=utcnow() + timedelta(hours=1))
    first, second = enqueue(ctx, 2)
    assert claim_next_run(ctx).id == first  # type: ignore[union-attr]
    assert claim_next_run(ctx).id == second  # type: ignore[union-attr]
    assert claim_next_run(ctx) is None
    assert later


def test_a_worker_at_its_concurrency_limit_is_passed_over(ctx: Context) -> None:
    a1, a2 = enqueue(ctx, 2, concurrency=1, worker_name="solo")
    (b1,) = enqueue(ctx, 1, worker_name="other")
    assert claim_next_run(ctx).id == a1  # type: ignore[union-attr]
    assert claim_next_run(ctx).id == b1  # type: ignore[union-attr]
    assert claim_next_run(ctx) is None
    assert a2


def test_an_expired_lease_is_requeued_with_the_next_attempt_or_failed(ctx: Context) -> None:
    (retryable,) = enqueue(ctx, 1, max_attempts=2)
    (final,) = enqueue(ctx, 1, max_attempts=1)
    dead = other_node(ctx, "dead-node")
    assert claim_next_run(dead) is not None
    assert claim_next_run(dead) is not None
    # Nobody renews; push the leases into the past instead of waiting for them.
    with session_scope(ctx.engine, write=True) as s:
        for run_id in (retryable, final):
            row = s.get(Run, run_id)
            assert row is not None
            row.lease_expires_at = utcnow() - timedelta(seconds=1)
            s.add(row)
    assert reap_expired_leases(ctx) == 2
    with session_scope(ctx.engine) as s:
        r = s.get(Run, retryable)
        f = s.get(Run, final)
        assert r is not None
        assert f is not None
        assert (r.status, r.attempt, r.lease_owner) == ("queued", 2, None)
        assert (f.status, f.error_code) == ("failed", "executor_lost")
    # The node that lost its runs learns it at its next heartbeat.
    cancel, lost = renew_leases(dead, [retryable, final])
    assert lost == {retryable, final}
    assert cancel == set()
    dead.engine.dispose()


def test_a_restarted_node_reclaims_its_own_runs_at_once(ctx: Context) -> None:
    (run_id,) = enqueue(ctx, 1, max_attempts=3)
    assert claim_next_run(ctx) is not None
    # Lease still valid, but the same node id starting again means its old process is gone.
    assert reap_expired_leases(ctx) == 0
    assert reap_expired_leases(ctx, own_node_restart=True) == 1
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
        assert row is not None
        assert (row.status, row.attempt) == ("queued", 2)


def test_racing_nodes_never_start_more_runs_of_a_worker_than_its_concurrency(
    ctx: Context,
) -> None:
    enqueue(ctx, 30, concurrency=2)
    nodes = [ctx, other_node(ctx, "node-b"), other_node(ctx, "node-c")]
    claimed: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(9)

    def worker(node: Context) -> None:
        start.wait(timeout=10)
        for _ in range(5):
            run = claim_next_run(node, look_first=False)
            if run is not None:
                with lock:
                    claimed.append(run.id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in nodes for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(claimed) == 2


def test_an_agent_s_child_run_is_not_claimed_past_its_worker_s_concurrency(ctx: Context) -> None:
    _, child = enqueue(ctx, 2, concurrency=1)
    assert claim_next_run(ctx) is not None
    assert claim_run(ctx, run_id=child) is None
    with session_scope(ctx.engine) as s:
        row = s.get(Run, child)
        assert row is not None
        assert row.status == "queued"  # an executor starts it when room is made


def test_a_late_end_of_an_earlier_attempt_leaves_the_next_attempt_alone(ctx: Context) -> None:
    (run_id,) = enqueue(ctx, 1, max_attempts=3)
    first = claim_next_run(ctx)
    assert first is not None
    # Its lease lapses, the reaper requeues it, and this same node claims attempt 2 while
    # attempt 1's thread is still recording its end.
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)
    assert reap_expired_leases(ctx) == 1
    second = claim_next_run(ctx)
    assert second is not None
    assert second.attempt == 2
    late = Outcome(
        status=RunStatus.FAILED, error_code=RunErrorCode.WORKER_ERROR, error_message="late"
    )
    status = finish_attempt(
        ctx, run=first, outcome=late, backoff=0, log_lines=[("stdout", "late line", None)]
    )
    assert status == "running"
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
        assert row is not None
        assert (row.status, row.attempt, row.lease_owner) == ("running", 2, ctx.node_id)
    events = list_events(ctx, run_id=run_id, caller=SYSTEM)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Fenced: the reap gave the run the next lease epoch, so attempt 1's lines are refused.
    assert [(e.line, e.attempt) for e in events if e.stream == "stdout"] == []
    # The attempt that holds the run records its end as usual.
    done = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})
    assert finish_attempt(ctx, run=second, outcome=done, backoff=0) == "succeeded"
    with session_scope(ctx.engine) as s:
        row = s.get(Run, run_id)
        assert row is not None
        assert (row.status, row.lease_owner) == ("succeeded", None)
        assert row.outputs_json == '{"ok": true}'


def test_a_claim_says_whether_another_runnable_run_is_queued(ctx: Context) -> None:
    first, second = enqueue(ctx, 2)
    enqueue(ctx, 1, not_before=utcnow() + timedelta(hours=1))
    taken = claim_next(ctx)
    assert (taken.run.id if taken.run else None, taken.more) == (first, True)
    taken = claim_next(ctx, look_first=False)
    assert (taken.run.id if taken.run else None, taken.more) == (second, False)
    assert claim_next(ctx, look_first=False) == Claim(None)


def test_an_attempts_end_takes_the_runs_event_lock_once(ctx: Context) -> None:
    # finish_attempt takes the lock first (before the run's row); its closing lines must not
    # take it again: on PostgreSQL each take is one more round trip on every run's end.
    enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    event.listen(ctx.engine, "before_cursor_execute", seen)
    try:
        done = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})
        lines = [("stdout", "last line", None)]
        assert finish_attempt(ctx, run=run, outcome=done, backoff=0, log_lines=lines) == (
            "succeeded"
        )
    finally:
        event.remove(ctx.engine, "before_cursor_execute", seen)
    locks = [s for s in statements if "pg_advisory_xact_lock" in s]
    assert len(locks) == (1 if ctx.engine.dialect.name == "postgresql" else 0)
    assert [e.line for e in list_events(ctx, run_id=run.id, caller=SYSTEM)][-2:] == [
        "last line",
        "succeeded",
    ]


def test_an_end_claims_the_slots_next_run_in_its_own_transaction(ctx: Context) -> None:
    # On SQLite a run's end and the next claim of its slot are one write transaction: one
    # hold of the write lock a run instead of two. On PostgreSQL the slot claims on its own.
    first, second, third = enqueue(ctx, 3)
    run = claim_next_run(ctx)
    assert run is not None
    assert run.id == first
    asked: list[str] = []

    def wanted(status: str) -> bool:
        asked.append(status)
        return True

    then_claim = NextClaim(wanted)
    done = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})
    with commits(ctx) as committed:
        assert finish_attempt(ctx, run=run, outcome=done, backoff=0, then_claim=then_claim) == (
            "succeeded"
        )
    with session_scope(ctx.engine) as s:
        ended, next_run = s.get(Run, first), s.get(Run, second)
        assert ended is not None
        assert next_run is not None
        assert (ended.status, ended.lease_owner) == ("succeeded", None)
    if ctx.engine.dialect.name == "postgresql":
        assert then_claim.claim is None
        assert next_run.status == "queued"
        assert len(committed) == 1
        return
    assert asked == ["succeeded"]
    assert len(committed) == 1, committed
    assert [is_end(x) for x in committed[0]].count(True) == 1
    assert [is_claim(x) for x in committed[0]].count(True) == 1
    claim = then_claim.claim
    assert claim is not None
    assert claim.run is not None
    assert claim.more
    assert claim.run.id == second
    assert (next_run.status, next_run.lease_owner, next_run.lease_epoch) == (
        "running",
        ctx.node_id,
        claim.run.lease_epoch,
    )
    assert claim.run.lease_epoch == 1
    started = [e.line for e in list_events(ctx, run_id=second, caller=SYSTEM)]
    assert started[-1].startswith("started"), started
    # The claimed run's own end claims the last one, which says nothing more is queued.
    again = NextClaim(lambda _status: True)
    assert finish_attempt(ctx, run=claim.run, outcome=done, backoff=0, then_claim=again) == (
        "succeeded"
    )
    assert again.claim is not None
    assert again.claim.run is not None
    assert (again.claim.run.id, again.claim.more) == (third, False)


def test_an_end_claims_nothing_when_the_slot_takes_no_next_run(ctx: Context) -> None:
    _first, second = enqueue(ctx, 2)
    run = claim_next_run(ctx)
    assert run is not None
    then_claim = NextClaim(lambda _status: False)
    done = Outcome(status=RunStatus.SUCCEEDED)
    with commits(ctx) as committed:
        assert finish_attempt(ctx, run=run, outcome=done, backoff=0, then_claim=then_claim) == (
            "succeeded"
        )
    assert then_claim.claim is None
    assert not any(is_claim(x) for t in committed for x in t)
    with session_scope(ctx.engine) as s:
        row = s.get(Run, second)
        assert row is not None
        assert row.status == "queued"


def test_an_end_whose_claim_finds_nothing_says_so(ctx: Context) -> None:
    enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    then_claim = NextClaim(lambda _status: True)
    done = Outcome(status=RunStatus.SUCCEEDED)
    assert finish_attempt(ctx, run=run, outcome=done, backoff=0, then_claim=then_claim) == (
        "succeeded"
    )
    expected = None if ctx.engine.dialect.name == "postgresql" else Claim(None)
    assert then_claim.claim == expected


def test_a_claim_that_fails_with_an_end_is_undone_alone(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim runs under a savepoint: it fails after its UPDATE (the look for more), and
    # the end stands while the run it took stays queued, its lease epoch untouched.
    first, second = enqueue(ctx, 2)
    run = claim_next_run(ctx)
    assert run is not None

    class Broken:
        def first(self, *_args: Any) -> Any:
            raise RuntimeError("broken look")

    monkeypatch.setattr(queue_module, "ANY_RUNNABLE", Broken())
    then_claim = NextClaim(lambda _status: True)
    done = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})
    assert finish_attempt(ctx, run=run, outcome=done, backoff=0, then_claim=then_claim) == (
        "succeeded"
    )
    assert then_claim.claim is None
    with session_scope(ctx.engine) as s:
        ended, left = s.get(Run, first), s.get(Run, second)
        assert ended is not None
        assert left is not None
        assert (ended.status, ended.outputs_json) == ("succeeded", '{"ok": true}')
        assert (left.status, left.lease_owner, left.lease_epoch) == ("queued", None, 0)
    assert not any(
        e.line.startswith("started") for e in list_events(ctx, run_id=second, caller=SYSTEM)
    )
    assert [e.line for e in list_events(ctx, run_id=first, caller=SYSTEM)][-1] == "succeeded"


def test_a_fenced_end_claims_nothing(ctx: Context) -> None:
    # The end of an attempt this node no longer holds writes nothing of the run's: nor does
    # it claim the slot's next run.
    (run_id, other) = enqueue(ctx, 2, max_attempts=3)
    first = claim_next_run(ctx)
    assert first is not None
    assert first.id == run_id
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)
    assert reap_expired_leases(ctx) == 1
    then_claim = NextClaim(lambda _status: True)
    late = Outcome(status=RunStatus.SUCCEEDED)
    assert finish_attempt(ctx, run=first, outcome=late, backoff=0, then_claim=then_claim) == (
        "queued"
    )
    assert then_claim.claim is None
    with session_scope(ctx.engine) as s:
        row = s.get(Run, other)
        assert row is not None
        assert row.status == "queued"
