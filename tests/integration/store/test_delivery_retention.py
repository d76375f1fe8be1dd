"""Retention of webhook and Composio deliveries and of delivery tombstones: the old ones go
(they were never pruned), and no key that can still verify goes with them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlmodel import select

from floom.services.context import Context
from floom.services.ops.deliveries import KEY_GRACE, prune_tombstones
from floom.services.ops.retention import apply_retention
from floom.services.triggers import webhooks
from floom.store.db import session_scope
from floom.store.models import Run, utcnow
from floom.store.triggers import DeliveryTombstone, Trigger, WebhookDelivery
from floom.vocabulary import RunStatus, RunTrigger, TriggerKind

OLD = timedelta(days=40)


def _trigger(
    ctx: Context, trigger_id: str, worker: str, signature: str, *, age: timedelta = 2 * OLD
) -> None:
    """A webhook trigger whose settings were last written `age` ago."""
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            Trigger(
                id=trigger_id,
                worker_name=worker,
                kind=TriggerKind.WEBHOOK,
                key="webhook",
                config_json=json.dumps({"secret": "HOOK_SECRET", "signature": signature}),
                updated_at=utcnow() - age,
            )
        )


def _delivery(
    ctx: Context,
    key: str,
    *,
    worker: str,
    trigger_id: str | None,
    age: timedelta,
    source: str = "webhook",
    digest: str | None = None,
    run_status: RunStatus | None = None,
    signature: str | None = None,
) -> None:
    with session_scope(ctx.engine, write=True) as s:
        run_id = None
        if run_status is not None:
            run_id = f"run_{key}"
            s.add(
                Run(
                    id=run_id,
                    worker_name=worker,
                    version_id="v",
                    status=run_status,
                    trigger=RunTrigger(source),
                )
            )
        s.add(
            WebhookDelivery(
                id=f"dlv_{key}",
                source=source,
                worker_name=worker,
                trigger_id=trigger_id,
                delivery_key=key,
                signature_digest=digest,
                received_at=utcnow() - age,
                run_id=run_id,
                outcome="run",
                signature=signature,
            )
        )


def _tombstone(ctx: Context, key: str, *, source: str, age: timedelta) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            DeliveryTombstone(
                source=source,
                worker_name="gone",
                key=key,
                delivery_id=f"dlv_{key}",
                outcome="run",
                received_at=utcnow() - age,
            )
        )


def _left(ctx: Context) -> tuple[set[str], set[str]]:
    with session_scope(ctx.engine) as s:
        kept = set(s.exec(select(WebhookDelivery.delivery_key)).all())
        buried = set(s.exec(select(DeliveryTombstone.key)).all())
    return kept, buried


def test_old_deliveries_go_and_keys_that_can_still_verify_stay_as_tombstones(
    ctx: Context,
) -> None:
    _trigger(ctx, "trg_std", "std", "standard")
    _trigger(ctx, "trg_hmac", "hm", "hmac-sha256")
    _trigger(ctx, "trg_gh", "gh", "github")
    _delivery(ctx, "std-old", worker="std", trigger_id="trg_std", age=OLD)
    _delivery(ctx, "hmac-old", worker="hm", trigger_id="trg_hmac", age=OLD)
    _delivery(ctx, "cmp-old", worker="", trigger_id=None, age=OLD, source="composio")
    _delivery(ctx, "gh-old", worker="gh", trigger_id="trg_gh", age=OLD, digest="sig-gh-old")
    _delivery(ctx, "lost-old", worker="gh", trigger_id="trg_gone", age=OLD)
    _delivery(ctx, "std-new", worker="std", trigger_id="trg_std", age=timedelta(days=2))
    # The scheme that verified a delivery decides, not its trigger's now (a redeploy changes
    # a webhook's scheme in place): GitHub's delivery to a hook that now signs a timestamp.
    _delivery(ctx, "was-gh", worker="std", trigger_id="trg_std", age=OLD, signature="github")
    _delivery(ctx, "was-std", worker="gh", trigger_id="trg_gh", age=OLD, signature="standard")
    # Stored before the scheme was kept, under a trigger written since: not known, kept.
    _trigger(ctx, "trg_changed", "changed", "standard", age=timedelta(days=1))
    _delivery(ctx, "changed-old", worker="changed", trigger_id="trg_changed", age=OLD)
    # A run started by a delivery and still waiting for approval keeps its delivery.
    waiting = RunStatus.AWAITING_APPROVAL
    _delivery(ctx, "std-wait", worker="std", trigger_id="trg_std", age=OLD, run_status=waiting)

    report = apply_retention(ctx, days=30)

    kept, buried = _left(ctx)
    assert kept == {"std-new", "std-wait"}
    assert report.webhook_deliveries_deleted == 8
    # GitHub signs no timestamp, and a trigger that is gone says no scheme: kept for good.
    assert buried == {"gh-old", "sig-gh-old", "lost-old", "was-gh", "changed-old"}
    again = webhooks._tombstone(ctx, source="webhook", worker_name="gh", key="gh-old", digest=None)
    assert again is not None
    assert again.id == "dlv_gh-old"
    # A second pass finds nothing more.
    assert apply_retention(ctx, days=30).webhook_deliveries_deleted == 0
    assert _left(ctx)[1] == buried


def test_without_retention_deliveries_stay_and_only_dead_composio_tombstones_go(
    ctx: Context,
) -> None:
    _delivery(ctx, "std-old", worker="std", trigger_id=None, age=OLD)
    _tombstone(ctx, "cmp-dead", source="composio", age=KEY_GRACE + timedelta(minutes=1))
    _tombstone(ctx, "cmp-live", source="composio", age=KEY_GRACE - timedelta(minutes=5))
    _tombstone(ctx, "hook-old", source="webhook", age=OLD)

    report = apply_retention(ctx, days=0)

    kept, buried = _left(ctx)
    assert kept == {"std-old"}
    assert buried == {"cmp-live", "hook-old"}
    assert report.delivery_tombstones_deleted == 1


def test_dead_tombstones_go_a_bounded_batch_per_write_transaction(ctx: Context) -> None:
    for i in range(5):
        _tombstone(ctx, f"cmp-dead-{i}", source="composio", age=KEY_GRACE + timedelta(hours=1))
    _tombstone(ctx, "hook-old", source="webhook", age=OLD)
    deleted_per_transaction: list[int] = []

    @contextmanager
    def write() -> Iterator[Any]:
        with session_scope(ctx.engine, write=True) as s:
            before = len(_left_tombstones(s))
            yield s
            s.flush()
            deleted_per_transaction.append(before - len(_left_tombstones(s)))

    assert prune_tombstones(write, now=utcnow(), limit=2) == 5

    assert _left(ctx)[1] == {"hook-old"}
    # Each write transaction held the lock for at most two deletes, not for all of them.
    assert deleted_per_transaction == [2, 2, 1, 0]


def _left_tombstones(s: Any) -> list[Any]:
    return list(s.exec(select(DeliveryTombstone.id)).all())
