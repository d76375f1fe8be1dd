"""Runs put straight into the queue, and other nodes on the same database, for the tests of
the queue and of leases."""

from __future__ import annotations

import weakref

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
