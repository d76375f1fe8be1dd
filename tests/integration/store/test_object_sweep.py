"""Objects no blob row names (an end whose log was uploaded but never recorded, a move whose
delete failed) are deleted from the bucket by retention's sweep once older than the grace;
an object a row names, a recent one, one outside floom's blobs and one whose end is being
recorded while the sweep runs stay. On a real SeaweedFS, both databases."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from floom.engine.queue import Outcome, claim_next_run, finish_attempt
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops import end_logs
from floom.services.ops.objects import sweep_objects
from floom.services.ops.retention import ORPHAN_GRACE, apply_retention
from floom.services.runs.logs import list_events
from floom.store.blobs.configured import s3_store
from floom.store.blobs.s3 import S3BlobStore
from floom.store.db import read_connection, write_connection
from floom.store.models import Run, utcnow
from floom.vocabulary import RunStatus
from tests.support.harness import fast_settings
from tests.support.rigs.queues import enqueue

pytestmark = pytest.mark.usefixtures("bucket_not_away")
DONE = Outcome(status=RunStatus.SUCCEEDED, outputs={"ok": True})


def _running(ctx: Context) -> Run:
    enqueue(ctx, 1)
    run = claim_next_run(ctx)
    assert run is not None
    return run


def _staged(ctx: Context, run: Run) -> end_logs.EndLog:
    """The run's whole log uploaded as its end would upload it, the end not recorded."""
    staged = end_logs.stage_end_log(
        ctx, run=run, closing=[("stdout", "last words", None)], now=utcnow()
    )
    assert staged is not None
    return staged


def _held(ctx: Context, digest: str) -> bool:
    return s3_store(ctx.settings).exists(digest) is not None


def test_an_object_no_row_names_is_deleted_once_older_than_the_grace(s3_ctx: Context) -> None:
    store = s3_store(s3_ctx.settings)
    # A node stopped between its upload and its end's commit: the object no row names.
    lost = _staged(s3_ctx, _running(s3_ctx)).digest
    # A run that ended: its log object is named by its run_logs row and blobs row.
    kept_run = _running(s3_ctx)
    finish_attempt(s3_ctx, run=kept_run, outcome=DONE, backoff=0)
    # Not a blob's key: not floom's to sweep.
    other = f"{store.prefix}other/notes"
    store._call("put_object", doing="put", Bucket=store.bucket, Key=other, Body=b"x")

    fresh = apply_retention(s3_ctx)
    assert fresh.objects_deleted == 0
    assert _held(s3_ctx, lost)

    later = utcnow() + ORPHAN_GRACE + timedelta(hours=1)
    report = apply_retention(s3_ctx, now=later)

    assert report.objects_deleted == 1
    assert report.to_dict()["objects_deleted"] == 1
    assert not _held(s3_ctx, lost)
    lines = [e.line for e in list_events(s3_ctx, run_id=kept_run.id, caller=SYSTEM)]
    assert lines[-1].startswith("succeeded")
    listed = store._call("list_objects_v2", doing="list", Bucket=store.bucket, Prefix=store.prefix)
    assert other in {o["Key"] for o in listed["Contents"]}
    # Idempotent: nothing more to delete.
    assert apply_retention(s3_ctx, now=later).objects_deleted == 0


def test_an_end_being_recorded_while_the_sweep_runs_keeps_its_object(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _running(s3_ctx)
    staged = _staged(s3_ctx, run)
    recording = threading.Event()
    commit = threading.Event()
    failed: list[BaseException] = []

    def end() -> None:
        # The end's transaction, holding its log's blob row uncommitted until told.
        try:
            with write_connection(s3_ctx.engine) as c:
                end_logs.record_end_log(c, staged)
                recording.set()
                commit.wait(30)
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)
            recording.set()

    listed = threading.Event()
    listing = S3BlobStore.listing

    def listed_then_told(store: S3BlobStore) -> Iterator[tuple[str, datetime]]:
        yield from listing(store)
        listed.set()

    monkeypatch.setattr(S3BlobStore, "listing", listed_then_told)
    # Connections opened beforehand: on SQLite, opening one waits for the writer's lock.
    with read_connection(s3_ctx.engine), read_connection(s3_ctx.engine):
        pass
    swept: list[int] = []
    ender = threading.Thread(target=end)
    ender.start()
    assert recording.wait(30)
    # However old the object looks, the sweep must not take it from the end in flight.
    sweeper = threading.Thread(
        target=lambda: swept.append(
            sweep_objects(s3_ctx, older_than=utcnow() + ORPHAN_GRACE + timedelta(hours=1))
        )
    )
    sweeper.start()
    assert listed.wait(30)
    # Time for it to find no committed row, were it to look without waiting for the end.
    sweeper.join(1.0)
    commit.set()
    ender.join(30)
    sweeper.join(30)

    assert not failed
    assert swept == [0]
    assert _held(s3_ctx, staged.digest)
    lines = [e.line for e in list_events(s3_ctx, run_id=run.id, caller=SYSTEM)]
    assert lines[-1] == "last words"


def test_without_a_bucket_the_sweep_does_nothing(tmp_path: Path, database_url: str) -> None:
    ctx = Context.open(fast_settings(tmp_path / "data", database_url))
    try:
        assert apply_retention(ctx, now=utcnow() + timedelta(days=30)).objects_deleted == 0
    finally:
        ctx.engine.dispose()
