"""Text neither database keeps (NUL, a lone UTF-16 surrogate) is stored as U+FFFD through any
column, filter or batch, not only the columns once typed for it:
store.statements.text.storable_parameters runs on every statement's parameters
(db.make_engine)."""

from __future__ import annotations

from sqlalchemy import insert
from sqlmodel import col, select

from floom.services.context import Context
from floom.services.runs.logs import append_events
from floom.store.db import session_scope
from floom.store.models import ApiKey, Artifact, RunEvent
from tests.support.rigs.queues import enqueue

SENT = "a\x00b\ud800c\U0001f600"
STORED = "a\ufffdb\ufffdc\U0001f600"


def test_a_plain_name_column_stores_nul_and_a_lone_surrogate_as_u_fffd(ctx: Context) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.add(ApiKey(id="key_1", name=SENT, prefix="p", key_hash="h", scopes="read"))
    with session_scope(ctx.engine) as s:
        key = s.get(ApiKey, "key_1")
        assert key is not None
        assert key.name == STORED
        # A filter holding them is bound the same way, so it finds what was stored.
        found = s.exec(select(ApiKey.id).where(col(ApiKey.name) == SENT)).all()
        assert found == ["key_1"]


def test_an_executemany_and_a_log_batch_store_them_as_u_fffd(ctx: Context) -> None:
    [run_id] = enqueue(ctx, 1)
    rows = [
        {"run_id": run_id, "name": f"{SENT}{i}", "size": 1, "digest": "d", "content_type": "t"}
        for i in range(3)
    ]
    with session_scope(ctx.engine, write=True) as s:
        s.execute(insert(Artifact), rows)
        # Not the run's first lines: on PostgreSQL one statement binds them as an array.
        append_events(s, run_id=run_id, attempt=1, lines=[("stdout", "x", None)])
        append_events(s, run_id=run_id, attempt=1, lines=[("stdout", SENT, None)] * 2)
    with session_scope(ctx.engine) as s:
        names = s.exec(select(Artifact.name).order_by(col(Artifact.name))).all()
        lines = s.exec(select(RunEvent.line).order_by(col(RunEvent.seq))).all()
    assert names == [f"{STORED}{i}" for i in range(3)]
    assert lines == ["x", STORED, STORED]
