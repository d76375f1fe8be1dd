"""Runs put straight into the queue, other nodes on the same database, and the write
transactions a test's steps commit, for the tests of the queue and of leases."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from floom.services.context import Context
from floom.store.db import make_engine, session_scope
from floom.store.models import Run, new_id
from floom.vocabulary import RunStatus


def enqueue(ctx: Context, count: int, **fields: object) -> list[str]:
    """`count` queued runs of a worker "w" (no such worker is needed to claim them)."""
    ids = []
    with session_scope(ctx.engine, write=True) as s:
        for _ in range(count):
            run = Run(id=new_id("run"), worker_name="w", version_id="v", status=RunStatus.QUEUED)
            for name, value in fields.items():
                setattr(run, name, value)
            s.add(run)
            ids.append(run.id)
    return ids


def other_node(ctx: Context, name: str) -> Context:
    """Another node on `ctx`'s database: an engine of its own and the node id `name`."""
    node = Context(
        settings=ctx.settings,
        engine=make_engine(ctx.settings.resolved_database_url),
        secret_box=ctx.secret_box,
        node_id=name,
    )
    # Its connections close with it, so a test need not dispose of its engine.
    weakref.finalize(node, node.engine.dispose)
    return node


@contextmanager
def commits(ctx: Context) -> Iterator[list[list[str]]]:
    """Each write transaction committed meanwhile, as the statements it sent."""
    committed: list[list[str]] = []
    open_: dict[int, list[str]] = {}

    def sent(conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        open_.setdefault(id(conn), []).append(statement)

    def commit(conn: Any) -> None:
        committed.append(open_.pop(id(conn), []))

    def rollback(conn: Any) -> None:
        open_.pop(id(conn), None)

    event.listen(ctx.engine, "before_cursor_execute", sent)
    event.listen(ctx.engine, "commit", commit)
    event.listen(ctx.engine, "rollback", rollback)
    try:
        yield committed
    finally:
        event.remove(ctx.engine, "before_cursor_execute", sent)
        event.remove(ctx.engine, "commit", commit)
        event.remove(ctx.engine, "rollback", rollback)


def is_claim(statement: str) -> bool:
    return statement.startswith("UPDATE runs") and "lease_epoch + " in statement


def is_end(statement: str) -> bool:
    return statement.startswith("UPDATE runs") and "sandbox_seconds + " in statement
