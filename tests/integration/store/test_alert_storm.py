"""An alert storm: a thousand runs of ten workers fail within a minute, and a hundred more
webhook deliveries than a page come in meanwhile. Each failure is recorded once, grouped into
one incident a worker (ten alerts, not a thousand), and what fails after the storm is still
seen at the next pass: a pass reads page after page, where it read one page and left the
rest to a next pass that read the same page again, for good. Both stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from floom.services.alerts import watch
from floom.services.context import Context
from floom.store.db import session_scope
from floom.store.models import AlertChannel, AlertEvent, AlertRule, Delivery, Run, new_id
from floom.store.triggers import WebhookDelivery
from floom.vocabulary import ChannelKind, RunStatus
from tests.support.harness import fast_settings

STORM = 1000
WORKERS = 10


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(fast_settings(tmp_path / "data", database_url))
    yield context
    context.engine.dispose()


def _failed(worker: str, at: datetime) -> Run:
    return Run(
        id=new_id("run"),
        worker_name=worker,
        version_id="v",
        status=RunStatus.FAILED,
        finished_at=at,
    )


def _hook(at: datetime, outcome: str) -> WebhookDelivery:
    row_id = new_id("dlv")
    return WebhookDelivery(
        id=row_id,
        delivery_key=row_id,
        trigger_id="trg_x",
        worker_name="hooked",
        source="webhook",
        outcome=outcome,
        received_at=at,
    )


def _count(ctx: Context, *where: Any) -> int:
    with session_scope(ctx.engine) as s:
        return int(s.exec(select(func.count()).select_from(AlertEvent).where(*where)).one())


def test_a_storm_of_failures_alerts_once_a_worker_and_what_fails_after_it_is_seen(
    ctx: Context,
) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.add(AlertChannel(id=new_id("ach"), name="ops", kind=ChannelKind.WEBHOOK))
        s.add(
            AlertRule(
                id=new_id("arl"),
                name="all",
                events_json=json.dumps(["run.failed", "trigger.failed"]),
                channels_json=json.dumps(["ops"]),
            )
        )
    pace = watch.Pace()
    watch.watch(ctx, pace=pace)
    start = datetime.now(UTC) - timedelta(seconds=60)
    with session_scope(ctx.engine, write=True) as s:
        for n in range(STORM):
            s.add(_failed(f"w{n % WORKERS}", start + timedelta(milliseconds=60 * n)))
        for n in range(watch.BATCH + 100):
            s.add(_hook(start + timedelta(milliseconds=60 * n), "run"))
    watch.watch(ctx, pace=pace)
    after = datetime.now(UTC)
    with session_scope(ctx.engine, write=True) as s:
        late = _failed("after-the-storm", after)
        s.add(late)
        s.add(_hook(after, "input_invalid"))
    watch.watch(ctx, pace=pace)

    assert _count(ctx, AlertEvent.kind == "run.failed") == STORM + 1
    assert _count(ctx, AlertEvent.run_id == late.id) == 1
    assert _count(ctx, AlertEvent.kind == "trigger.failed") == 1
    assert _count(ctx, AlertEvent.outcome == "opened") == WORKERS + 2
    with session_scope(ctx.engine) as s:
        sent = s.exec(select(func.count()).select_from(Delivery)).one()
    # One alert an incident opened, within the channel's throttle (the rest kept throttled).
    assert sent == WORKERS + 2
