"""A receiver that hangs holds one of a node's senders, not its alert watch nor the sends to
other receivers (floom/engine/loops/alerts.py, Sends): while twenty deliveries wait behind
one that hangs, a run that fails is still recorded at the next pass and a delivery to
another receiver still arrives; once the receiver answers, each of the twenty arrives once.
Both stores; the receivers on loopback."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from floom.engine.loops.alerts import SENDERS, AlertLoop
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.store.db import session_scope
from floom.store.models import AlertChannel, AlertEvent, Delivery, Run, new_id
from floom.vocabulary import ChannelKind, DeliveryPurpose, DeliveryStatus, RunStatus
from tests.support.harness import fast_settings, wait_until
from tests.support.rigs.alerts import receiver

HUNG = 20
SIGNING_KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(
        fast_settings(
            tmp_path / "data",
            database_url,
            agent_http_allow_private=True,  # the receivers are on loopback
            alert_timeout_seconds=60.0,  # a hung send holds for up to two minutes
            alert_poll_seconds=0.05,
        )
    )
    yield context
    context.engine.dispose()


def _callback(ctx: Context, url: str, n: int, *, channel: AlertChannel | None = None) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            Delivery(
                id=new_id("dlv"),
                purpose=DeliveryPurpose.ALERT if channel else DeliveryPurpose.CALLBACK,
                channel_id=channel.id if channel else None,
                channel_name=channel.name if channel else None,
                target=None if channel else url,
                body_json=f'{{"n": {n}}}',
                status=DeliveryStatus.PENDING,
                max_attempts=3,
                next_attempt_at=datetime.now(UTC) - timedelta(seconds=1),
            )
        )


def _recorded(ctx: Context, run_id: str) -> bool:
    with session_scope(ctx.engine) as s:
        return s.exec(select(AlertEvent).where(AlertEvent.run_id == run_id)).first() is not None


def test_a_receiver_that_hangs_holds_neither_the_watch_nor_the_sends_to_others(
    ctx: Context,
) -> None:
    with receiver(then="hang", hang_seconds=120) as hung, receiver() as other:
        for n in range(HUNG):
            _callback(ctx, hung.url, n)
        loop = AlertLoop(ctx)
        loop.start()
        try:
            wait_until(lambda: hung.tried >= 1)  # a send hangs
            run = Run(
                id=new_id("run"),
                worker_name="other-worker",
                version_id="v",
                status=RunStatus.FAILED,
                finished_at=datetime.now(UTC),
            )
            with session_scope(ctx.engine, write=True) as s:
                s.add(run)
            wait_until(lambda: _recorded(ctx, run.id))
            _callback(ctx, other.url, 100)
            assert other.wait_for(1) == [{"n": 100}]
            assert hung.tried == 1  # one send at a time to it

            hung.released.set()
            bodies = hung.wait_for(HUNG, timeout=60)
        finally:
            loop.stop()
    assert sorted(body["n"] for body in bodies) == list(range(HUNG))  # each once


def test_callbacks_to_a_host_that_hangs_leave_a_sender_to_the_alerts(ctx: Context) -> None:
    """Whoever starts runs chooses their callback URLs: as many as they like, each its own
    receiver, all on one host that hangs. They take every sender but one."""
    secrets.set_secret(ctx, name="HOOK_KEY", value=SIGNING_KEY, caller=SYSTEM)
    with receiver(then="hang", hang_seconds=120) as hung, receiver() as ops:
        channel = AlertChannel(
            id=new_id("ach"),
            name="ops",
            kind=ChannelKind.WEBHOOK,
            config_json=json.dumps({"url": ops.url, "secret": "HOOK_KEY"}),
        )
        with session_scope(ctx.engine, write=True) as s:
            s.add(channel)
        for n in range(2 * SENDERS):
            _callback(ctx, f"{hung.url}?n={n}", n)
        loop = AlertLoop(ctx)
        loop.start()
        try:
            wait_until(lambda: hung.tried >= SENDERS - 1)
            _callback(ctx, ops.url, 100, channel=channel)
            assert ops.wait_for(1) == [{"n": 100}]
            assert hung.tried == SENDERS - 1
            hung.released.set()
            hung.wait_for(2 * SENDERS, timeout=60)
        finally:
            loop.stop()
