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
from floom.services.context import Context
from floom.services.ops.retention import ORPHAN_GRACE, apply_retention
from floom.store.blobs.rows import inline_blob, insert_blob
from floom.store.db import session_scope
from floom.store.models import Artifact, Blob, Run, RunEvent, new_id, utcnow
from floom.vocabulary import RunStatus
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
        assert report.pages_freed > 0
        after = _footprint(db)
        assert after < before - 8 * 1024 * 1024, (before, after)
        with session_scope(ctx.engine) as s:
            mode = s.connection().exec_driver_sql("PRAGMA auto_vacuum").scalar()
        assert mode == 2  # incremental from now on, the old file included
    finally:
        ctx.engine.dispose()
