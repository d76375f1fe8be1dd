"""No database connection is held while floom talks to the object store, and no thread that
holds one asks the pool for another, through an agent run's life on object storage (its
deploy, run, end, reads of its record, log and artifact, the upkeep's sweep and a pending
upload): an upload or a download may take the store's timeout, and a connection held
meanwhile (or a second one asked for) makes concurrent work open one more connection, on
which PostgreSQL prepares and plans every statement anew (bench/README.md "Which plan
changes?"). On a real SeaweedFS, both databases; the store's client is only observed."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from floom.agent.runner import run_agent
from floom.engine.executor import Executor
from floom.sandbox.fake import FakeSandbox
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops.objects import archive_logs, drain_pending
from floom.services.replays.recordings import load_recording
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs.logs import list_events
from floom.store.blobs import logs
from floom.store.blobs.rows import UPLOAD, inline_blob, insert_blob
from floom.store.blobs.s3 import S3BlobStore
from floom.store.blobs.tables import PendingBlob
from floom.store.db import session_scope
from floom.store.models import Blob, utcnow
from tests.support.harness import wait_until
from tests.support.rigs.agents import notes_agent

pytestmark = pytest.mark.usefixtures("bucket_not_away")


@dataclass
class Holdings:
    """Which threads hold a pool connection of the engine, as its pool's events tell."""

    held: Counter[int] = field(default_factory=Counter)
    # A thread that asked for a connection while holding one: where.
    nested: list[str] = field(default_factory=list)
    # Object store operations called by a thread holding a connection.
    held_over: list[str] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def holdings(s3_ctx: Context, monkeypatch: pytest.MonkeyPatch) -> Iterator[Holdings]:
    seen = Holdings()
    pool = s3_ctx.engine.pool

    def checkout(_dbapi: Any, _record: Any, _proxy: Any) -> None:
        me = threading.get_ident()
        with seen.lock:
            if seen.held[me]:
                seen.nested.append(threading.current_thread().name)
            seen.held[me] += 1

    def checkin(_dbapi: Any, _record: Any) -> None:
        me = threading.get_ident()
        with seen.lock:
            if seen.held[me]:
                seen.held[me] -= 1

    real_call = S3BlobStore._call

    def observed(self: S3BlobStore, operation: str, **params: Any) -> Any:
        with seen.lock:
            seen.calls[operation] += 1
            if seen.held[threading.get_ident()]:
                seen.held_over.append(operation)
        return real_call(self, operation, **params)

    event.listen(pool, "checkout", checkout)
    event.listen(pool, "checkin", checkin)
    monkeypatch.setattr(S3BlobStore, "_call", observed)
    try:
        yield seen
    finally:
        event.remove(pool, "checkout", checkout)
        event.remove(pool, "checkin", checkin)


def test_an_agent_run_on_object_storage_holds_no_connection_while_the_store_is_called(
    s3_ctx: Context, holdings: Holdings, tmp_path: Path
) -> None:
    notes_agent(s3_ctx, tmp_path / "agent")
    executor = Executor(s3_ctx, FakeSandbox({}), run_agent=run_agent)
    executor.start()
    try:
        run_id = runs.create_run(s3_ctx, caller=SYSTEM, worker_name="agent", inputs={}).id
        done = wait_until(
            lambda: (r := runs.get_run(s3_ctx, caller=SYSTEM, run_id=run_id)).finished_at and r
        )
    finally:
        executor.stop(grace_seconds=2)
    assert done.status == "succeeded"

    # Its record, log and artifact read back (from the bucket: no cached copy).
    logs._cache.clear()
    assert [c.name for c in load_recording(s3_ctx, run_id=run_id, caller=SYSTEM).calls] == [
        "write_file",
        "read_file",
    ]
    calls = agent_runs.list_tool_calls(s3_ctx, run_id=run_id, caller=SYSTEM)
    assert [c.tool for c in calls] == ["write_file", "read_file", "finish"]
    assert list_events(s3_ctx, run_id=run_id, after=0, caller=SYSTEM)
    for artifact in runs.list_artifacts(s3_ctx, run_id=run_id, caller=SYSTEM):
        runs.read_artifact(s3_ctx, run_id=run_id, name=artifact.name, caller=SYSTEM)

    # The upkeep's sweep, and a pending upload (a blob the store could not take) done.
    pending = inline_blob(b"kept in the row while the store was away")
    with session_scope(s3_ctx.engine, write=True) as s:
        insert_blob(s, pending)
        s.add(PendingBlob(digest=pending.digest, action=UPLOAD, created_at=utcnow()))
    archive_logs(s3_ctx)
    assert drain_pending(s3_ctx).uploaded == 1
    with session_scope(s3_ctx.engine) as s:
        moved = s.get(Blob, pending.digest)
        assert moved is not None
        assert moved.location == "s3"

    # The store was talked to (uploads and downloads), never over a held connection.
    assert holdings.calls["put_object"] >= 3, holdings.calls  # version, artifact, log, pending
    assert holdings.calls["get_object"] >= 1, holdings.calls
    assert holdings.held_over == []
    assert holdings.nested == []
