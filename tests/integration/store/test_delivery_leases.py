"""A delivery claimed in a batch is sent only while its claim holds: a node sends its batch
one after another, and a slow receiver can hold each send up to its deadline, so a claim
taken with the batch may have run out (and another node taken it) before its turn comes.
Both stores; the receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from floom.services.alerts import deliveries
from floom.services.context import Context
from floom.store.db import session_scope
from floom.store.models import Delivery, new_id, utcnow
from floom.vocabulary import DeliveryPurpose, DeliveryStatus
from tests.support.harness import fast_settings
from tests.support.rigs.alerts import receiver


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(
        fast_settings(
            tmp_path / "data",
            database_url,
            agent_http_allow_private=True,  # the receiver is on loopback
            alert_timeout_seconds=1.0,
        )
    )
    yield context
    context.engine.dispose()


def test_a_delivery_whose_claim_ran_out_and_was_taken_is_not_sent_twice(ctx: Context) -> None:
    with receiver() as hook:
        now = utcnow()
        with session_scope(ctx.engine, write=True) as s:
            for n in range(2):
                s.add(
                    Delivery(
                        id=new_id("dlv"),
                        purpose=DeliveryPurpose.CALLBACK,
                        target=hook.url,
                        body_json=f'{{"n": {n}}}',
                        status=DeliveryStatus.PENDING,
                        max_attempts=3,
                        next_attempt_at=now - timedelta(seconds=2 - n),
                    )
                )
        a, b = replace(ctx, node_id="node-a"), replace(ctx, node_id="node-b")
        first, second = deliveries.claim_due(a)
        # Node A's first send took past the claim of the second (a slow receiver), and node
        # B took that one and sent it.
        with session_scope(ctx.engine, write=True) as s:
            row = s.get(Delivery, second.id)
            assert row is not None
            row.lease_expires_at = utcnow() - timedelta(seconds=1)
            s.add(row)
        assert [d.id for d in deliveries.claim_due(b)] == [second.id]
        deliveries.attempt(b, second)
        # Node A goes on with its batch.
        deliveries.send_claimed(a, [first, second])
        hook.wait_for(2)
        assert sorted(body["n"] for body in hook.bodies()) == [0, 1]
        with session_scope(ctx.engine) as s:
            rows = [s.get(Delivery, d.id) for d in (first, second)]
        assert [(r.status, r.attempts) for r in rows if r] == [(DeliveryStatus.DELIVERED, 1)] * 2
