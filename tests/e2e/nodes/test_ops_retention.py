"""Retention: finished runs' logs and artifacts older than the setting (or the worker's own
`retention_days`) go in batches, blobs nothing refers to are reclaimed, and runs that are
queued, running or awaiting approval are never touched."""

from __future__ import annotations

import os
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import col, select

from floom.engine.loops.housekeeping import Housekeeping
from floom.errors import Conflict
from floom.services.context import Context
from floom.services.ops import nodes
from floom.services.ops.retention import ORPHAN_GRACE, apply_retention, compact_store
from floom.store.blobs.rows import inline_blob, insert_blob
from floom.store.db import session_scope
from floom.store.models import (
    AlertEvent,
    AlertIncident,
    Artifact,
    Blob,
    Delivery,
    Run,
    RunCallback,
    RunEvent,
    new_id,
    utcnow,
)
from floom.vocabulary import DeliveryPurpose, DeliveryStatus, RunStatus
from tests.support.harness import deploy_in_store, fast_settings, make_worker, wait_until

NOW = utcnow()


def _deploy(ctx: Context, folder: Path, name: str, extra: str = "") -> str:
    manifest = f"name: {name}\n{extra}"
    result = deploy_in_store(ctx, make_worker(folder / name, manifest, {"run.py": "print('hi')\n"}))
    return result.worker.active_version_id or ""


def _run(
    ctx: Context,
    worker: str,
    version: str,
    status: RunStatus,
    *,
    ended_days_ago: float,
    files: dict[str, bytes],
) -> str:
    ended = NOW - timedelta(days=ended_days_ago)
    finished = status not in {"queued", "running", "awaiting_approval"}
    with session_scope(ctx.engine, write=True) as s:
        run = Run(
            id=new_id("run"),
            worker_name=worker,
            version_id=version,
            status=status,
            created_at=ended,
            started_at=ended,
            finished_at=ended if finished else None,
        )
        s.add(run)
        for seq in (1, 2):
            s.add(RunEvent(run_id=run.id, seq=seq, stream="stdout", line=f"line {seq}"))
        for name, data in files.items():
            digest = insert_blob(s, inline_blob(data))
            s.add(
                Artifact(
                    run_id=run.id,
                    name=name,
                    size=len(data),
                    digest=digest,
                    content_type="text/plain",
                )
            )
    return run.id


def _left(ctx: Context, run_id: str) -> tuple[int, int]:
    with session_scope(ctx.engine) as s:
        lines = s.exec(select(RunEvent.id).where(RunEvent.run_id == run_id)).all()
        files = s.exec(select(Artifact.id).where(Artifact.run_id == run_id)).all()
    return len(lines), len(files)


def _blobs(ctx: Context) -> set[str]:
    with session_scope(ctx.engine) as s:
        return set(s.exec(select(Blob.digest)).all())


def _orphan(ctx: Context, data: bytes, *, created: datetime) -> str:
    with session_scope(ctx.engine, write=True) as s:
        digest = insert_blob(s, inline_blob(data))
        blob = s.get(Blob, digest)
        assert blob is not None
        blob.created_at = created
        s.add(blob)
    return digest


def test_old_finished_runs_lose_logs_and_artifacts_and_unfinished_runs_keep_theirs(
    ctx: Context, tmp_path: Path
) -> None:
    plain = _deploy(ctx, tmp_path, "plain")
    keep = _deploy(ctx, tmp_path, "keeper", "retention_days: 0\n")
    short = _deploy(ctx, tmp_path, "brief", "retention_days: 1\n")
    old = _run(
        ctx, "plain", plain, RunStatus.SUCCEEDED, ended_days_ago=10, files={"a.txt": b"only old"}
    )
    also_old = _run(
        ctx, "plain", plain, RunStatus.FAILED, ended_days_ago=9, files={"s.txt": b"shared"}
    )
    recent = _run(
        ctx, "plain", plain, RunStatus.SUCCEEDED, ended_days_ago=1, files={"s.txt": b"shared"}
    )
    waiting = _run(
        ctx,
        "plain",
        plain,
        RunStatus.AWAITING_APPROVAL,
        ended_days_ago=30,
        files={"p.txt": b"paused"},
    )
    running = _run(ctx, "plain", plain, RunStatus.RUNNING, ended_days_ago=30, files={})
    queued = _run(ctx, "plain", plain, RunStatus.QUEUED, ended_days_ago=30, files={})
    kept_forever = _run(
        ctx, "keeper", keep, RunStatus.FAILED, ended_days_ago=30, files={"k": b"kept"}
    )
    short_lived = _run(
        ctx, "brief", short, RunStatus.SUCCEEDED, ended_days_ago=2, files={"b": b"brief"}
    )
    stale_orphan = _orphan(ctx, b"left by a retry", created=NOW - ORPHAN_GRACE - timedelta(1))
    fresh_orphan = _orphan(ctx, b"just stored", created=NOW)
    blobs_before = _blobs(ctx)

    report = apply_retention(ctx, days=7, now=NOW, batch_runs=1)

    for pruned in (old, also_old, short_lived):
        assert _left(ctx, pruned) == (0, 0)
    for untouched in (recent, waiting, kept_forever):
        assert _left(ctx, untouched) == (2, 1)
    for untouched in (running, queued):
        assert _left(ctx, untouched) == (2, 0)
    assert report.runs_pruned == 3
    assert report.log_lines_deleted == 6
    assert report.artifacts_deleted == 3
    gone = blobs_before - _blobs(ctx)
    # The shared blob stays (a recent run refers to it); the fresh orphan is in its grace.
    assert len(gone) == report.blobs_deleted == 3
    assert stale_orphan in gone
    assert fresh_orphan not in gone
    with session_scope(ctx.engine) as s:
        statuses = dict(s.exec(select(Run.id, Run.status).where(col(Run.id).in_([old]))).all())
    assert statuses == {old: "succeeded"}  # the run itself stays

    again = apply_retention(ctx, days=7, now=NOW)
    assert again.to_dict() == {
        "runs_pruned": 0,
        "log_lines_deleted": 0,
        "artifacts_deleted": 0,
        "blobs_deleted": 0,
        "objects_deleted": 0,
        "alert_events_deleted": 0,
        "alert_incidents_deleted": 0,
        "alert_deliveries_deleted": 0,
        "webhook_deliveries_deleted": 0,
        "delivery_tombstones_deleted": 0,
        "pages_freed": 0,
    }


def test_with_no_retention_set_only_stale_orphan_blobs_go(ctx: Context, tmp_path: Path) -> None:
    plain = _deploy(ctx, tmp_path, "plain")
    ancient = _run(ctx, "plain", plain, RunStatus.SUCCEEDED, ended_days_ago=3000, files={"x": b"x"})
    stale = _orphan(ctx, b"orphan", created=NOW - ORPHAN_GRACE - timedelta(hours=1))
    report = apply_retention(ctx, now=NOW)
    assert _left(ctx, ancient) == (2, 1)
    assert report.runs_pruned == 0
    assert report.blobs_deleted == 1
    assert stale not in _blobs(ctx)


def test_the_housekeeping_thread_of_a_scheduler_node_applies_retention_by_itself(
    ctx: Context,
) -> None:
    stale = _orphan(ctx, b"orphan of a retry", created=NOW - ORPHAN_GRACE - timedelta(hours=1))
    keeper = Housekeeping(ctx, first_delay=0.01)
    keeper.start()
    try:
        wait_until(lambda: stale not in _blobs(ctx), timeout=20)
    finally:
        keeper.stop()


def _footprint(db: Path) -> int:
    """What the database holds on disk: the file and its write-ahead log."""
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


@pytest.mark.parametrize("made_before_auto_vacuum", [False, True])
def test_retention_on_sqlite_gives_the_freed_space_back_to_the_disk(
    tmp_path: Path, made_before_auto_vacuum: bool
) -> None:
    db = tmp_path / "floom.db"
    if made_before_auto_vacuum:
        # A file as floom made it before: WAL set first, so auto_vacuum stayed off.
        old = sqlite3.connect(db)
        old.execute("PRAGMA journal_mode=WAL")
        old.close()
    ctx = Context.open(fast_settings(tmp_path / "data", f"sqlite:///{db}"))
    try:
        plain = _deploy(ctx, tmp_path, "plain")
        for i in range(40):
            big = os.urandom(256 * 1024) + str(i).encode()
            _run(
                ctx, "plain", plain, RunStatus.SUCCEEDED, ended_days_ago=30, files={"big.bin": big}
            )
        side = sqlite3.connect(db)
        side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        side.close()
        before = _footprint(db)
        assert before > 10 * 1024 * 1024

        report = apply_retention(ctx, days=7, now=NOW)

        assert report.runs_pruned == 40
        if made_before_auto_vacuum:
            # Only a full VACUUM gives an old file's pages back, and it holds the write lock
            # for the whole rewrite: never in a pass, only when the operator asks.
            assert report.pages_freed == 0
            assert _auto_vacuum(ctx) == 0
            assert compact_store(ctx) > 0
        else:
            assert report.pages_freed > 0
        after = _footprint(db)
        assert after < before - 8 * 1024 * 1024, (before, after)
        assert _auto_vacuum(ctx) == 2  # incremental from now on, the old file included
    finally:
        ctx.engine.dispose()


def _auto_vacuum(ctx: Context) -> int:
    with session_scope(ctx.engine) as s:
        return int(s.connection().exec_driver_sql("PRAGMA auto_vacuum").scalar() or 0)


def test_compact_refuses_to_rebuild_an_old_file_while_a_node_serves_it(tmp_path: Path) -> None:
    db = tmp_path / "floom.db"
    old = sqlite3.connect(db)
    old.execute("PRAGMA journal_mode=WAL")
    old.close()
    ctx = Context.open(fast_settings(tmp_path / "data", f"sqlite:///{db}"))
    try:
        nodes.register(ctx, slots=1)
        with pytest.raises(Conflict) as refused:
            compact_store(ctx)
        assert "stop floom first" in (refused.value.hint or "")
        assert _auto_vacuum(ctx) == 0  # nothing changed
        nodes.mark_stopped(ctx)
        compact_store(ctx)
        assert _auto_vacuum(ctx) == 2
    finally:
        ctx.engine.dispose()


def _incident(ctx: Context, *, days_ago: float, closed: bool) -> str:
    at = NOW - timedelta(days=days_ago)
    incident = AlertIncident(
        id=new_id("inc"),
        subject=f"subject:{new_id('s')}",
        kind="run.failed",
        opened_at=at,
        last_event_at=at,
        closed_at=at if closed else None,
    )
    if not closed:
        incident.open_key = incident.subject
    with session_scope(ctx.engine, write=True) as s:
        s.add(incident)
    return incident.id


def _event(
    ctx: Context, *, days_ago: float, incident: str | None = None, run: str | None = None
) -> str:
    event = AlertEvent(
        id=new_id("evt"),
        key=new_id("key"),
        kind="run.failed",
        subject="s",
        run_id=run,
        incident_id=incident,
        outcome="opened" if incident else "notice",
        created_at=NOW - timedelta(days=days_ago),
    )
    with session_scope(ctx.engine, write=True) as s:
        s.add(event)
    return event.id


def _delivery(
    ctx: Context, *, days_ago: float, status: DeliveryStatus, callback_of: str = ""
) -> str:
    delivery = Delivery(
        id=new_id("dlv"),
        purpose=DeliveryPurpose.CALLBACK if callback_of else DeliveryPurpose.ALERT,
        status=status,
        created_at=NOW - timedelta(days=days_ago),
    )
    with session_scope(ctx.engine, write=True) as s:
        s.add(delivery)
        if callback_of:
            s.add(RunCallback(run_id=callback_of, url="https://x.test/", delivery_id=delivery.id))
    return delivery.id


def _ids(ctx: Context, table: type[AlertEvent | AlertIncident | Delivery]) -> set[str]:
    with session_scope(ctx.engine) as s:
        return set(s.exec(select(table.id)).all())


def test_old_alert_events_closed_incidents_and_sent_deliveries_go_and_live_ones_stay(
    ctx: Context, tmp_path: Path
) -> None:
    version = _deploy(ctx, tmp_path, "plain")
    waiting = _run(ctx, "plain", version, RunStatus.AWAITING_APPROVAL, ended_days_ago=40, files={})
    ended = _run(ctx, "plain", version, RunStatus.FAILED, ended_days_ago=40, files={})
    old_closed = _incident(ctx, days_ago=40, closed=True)
    old_open = _incident(ctx, days_ago=40, closed=False)
    recent_closed = _incident(ctx, days_ago=2, closed=True)
    gone_events = {
        _event(ctx, days_ago=40, incident=old_closed, run=ended),
        _event(ctx, days_ago=40),
    }
    kept_events = {
        _event(ctx, days_ago=40, incident=old_open),  # its incident is still open
        _event(ctx, days_ago=40, run=waiting),  # its run still waits: it would alert again
        _event(ctx, days_ago=2, incident=recent_closed),
    }
    gone_deliveries = {
        _delivery(ctx, days_ago=40, status=DeliveryStatus.DELIVERED, callback_of=ended),
        _delivery(ctx, days_ago=40, status=DeliveryStatus.FAILED),
        _delivery(ctx, days_ago=40, status=DeliveryStatus.THROTTLED),
    }
    kept_deliveries = {
        _delivery(ctx, days_ago=40, status=DeliveryStatus.PENDING),  # still to be sent
        _delivery(ctx, days_ago=2, status=DeliveryStatus.DELIVERED),
    }

    report = apply_retention(ctx, alert_days=30, now=NOW, max_batches=None)

    assert _ids(ctx, AlertEvent) == kept_events
    assert _ids(ctx, AlertIncident) == {old_open, recent_closed}
    assert _ids(ctx, Delivery) == kept_deliveries
    with session_scope(ctx.engine) as s:
        assert s.exec(select(RunCallback)).all() == []
    assert (
        report.alert_events_deleted,
        report.alert_incidents_deleted,
        report.alert_deliveries_deleted,
    ) == (len(gone_events), 1, len(gone_deliveries))
    assert report.runs_pruned == 0  # FLOOM_RETENTION_DAYS (0) keeps the runs' logs
    again = apply_retention(ctx, alert_days=30, now=NOW)
    assert again.alert_events_deleted == again.alert_deliveries_deleted == 0


def test_the_alert_retention_setting_applies_and_zero_keeps_alert_history(
    tmp_path: Path, database_url: str
) -> None:
    for days, left in ((0, 1), (30, 0)):
        ctx = Context.open(
            fast_settings(tmp_path / f"d{days}", database_url, alert_retention_days=days)
        )
        try:
            _delivery(ctx, days_ago=40, status=DeliveryStatus.DELIVERED)
            apply_retention(ctx, now=NOW)
            assert len(_ids(ctx, Delivery)) == left
        finally:
            ctx.engine.dispose()
