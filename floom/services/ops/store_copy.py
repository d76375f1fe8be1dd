"""Copying a whole store to another database: how a SQLite node moves to PostgreSQL.

Every table goes, row by row in primary-key order (workers, versions and their archives,
runs, logs, artifacts, secrets still encrypted, keys, triggers, approvals, handoffs, audit),
read in one transaction of the source (one snapshot) and written in one transaction of the
target (all or nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Table, func, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, SQLModel, col
from sqlmodel import select as select_rows

from floom.config import mask_password
from floom.errors import Conflict, InvalidRequest, StoreUnavailable
from floom.services.ops.nodes import state_of
from floom.store.db import database_clock, driver_reason, make_engine
from floom.store.migrate import migrate
from floom.store.nodes import Node
from floom.vocabulary import NodeState

# Rows held in memory at once: blobs hold archives and artifacts of up to tens of MiB.
BATCH_ROWS = 200

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class StoreCopy:
    """What a copy moved: rows per table, the same in source and target."""

    source: str
    target: str
    counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_store(*, source_url: str, target_url: str, progress: Progress | None = None) -> StoreCopy:
    """Copy every floom table from `source_url` into the empty database at `target_url`.

    The target gets floom's schema first (it may be a fresh database without tables); a
    target holding any floom row raises Conflict and is left as it was. The source is
    brought to the current schema as `floom serve` would. Stop floom on the source first:
    runs written after the copy's snapshot are not copied.
    """
    if _same_database(source_url, target_url):
        raise InvalidRequest(
            "the source and the target are the same database",
            hint="name a new, empty database with --to",
        )
    source = _open(source_url)
    try:
        _refuse_served(source, source_url)
    except BaseException:
        source.dispose()
        raise
    target = _open(target_url, migrated=False)
    try:
        _refuse_non_empty(target, target_url)
        _migrate(target, target_url)
        counts: dict[str, int] = {}
        reading = source.connect()
        if reading.dialect.name == "postgresql":
            # PostgreSQL's READ COMMITTED gives each statement a snapshot of its own.
            reading = reading.execution_options(isolation_level="REPEATABLE READ")
        with reading as read, target.begin() as write:
            # One read transaction: the copy is one snapshot even if something still writes.
            read.execute(text("SELECT 1"))
            for table in SQLModel.metadata.sorted_tables:
                counts[table.name] = _copy_table(read, write, table, progress)
            if write.dialect.name == "postgresql":
                _advance_sequences(write)
            for table in SQLModel.metadata.sorted_tables:
                copied = write.execute(select(func.count()).select_from(table)).scalar_one()
                if copied != counts[table.name]:
                    raise Conflict(
                        f"{table.name}: {copied} rows in the target, {counts[table.name]} read",
                        hint="nothing was written; run the copy again with floom stopped",
                    )
            read.rollback()
    except SQLAlchemyError as exc:
        raise StoreUnavailable(
            f"the copy failed: {type(getattr(exc, 'orig', None) or exc).__name__}: "
            f"{mask_password(str(getattr(exc, 'orig', None) or exc).splitlines()[0][:200])}",
            hint="nothing was written to the target; check both databases and run it again",
        ) from exc
    finally:
        source.dispose()
        target.dispose()
    return StoreCopy(
        source=mask_password(source_url), target=mask_password(target_url), counts=counts
    )


def _copy_table(
    read: Connection, write: Connection, table: Table, progress: Progress | None
) -> int:
    order = list(table.primary_key.columns)
    result = read.execution_options(yield_per=BATCH_ROWS).execute(select(table).order_by(*order))
    total = 0
    for batch in result.partitions():
        rows = [dict(row._mapping) for row in batch]
        write.execute(table.insert(), rows)
        total += len(rows)
        if progress is not None:
            progress(table.name, total)
    return total


def _advance_sequences(write: Connection) -> None:
    """Rows came with their integer ids; PostgreSQL's sequences must start after them."""
    for table in SQLModel.metadata.sorted_tables:
        keys = list(table.primary_key.columns)
        if len(keys) != 1 or keys[0].type.python_type is not int:
            continue
        seq = write.execute(
            text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": keys[0].name}
        ).scalar()
        if seq is not None:
            write.execute(
                text(
                    f"SELECT setval(:seq, COALESCE((SELECT MAX({keys[0].name}) FROM "
                    f"{table.name}), 0) + 1, false)"
                ),
                {"seq": seq},
            )


def _refuse_served(engine: Engine, url: str) -> None:
    """A node that renews its row in the source is serving it: runs it writes after the
    copy's snapshot would be lost, so the copy waits until it is stopped."""
    now = database_clock(engine).earliest()
    with Session(engine) as s:
        rows = s.exec(select_rows(Node).where(col(Node.stopped_at).is_(None))).all()
    live = [n for n in rows if state_of(n, now=now)[0] == NodeState.LIVE]
    if not live:
        return
    node = live[0]
    silent = state_of(node, now=now)[1]
    others = f" (and {len(live) - 1} more)" if len(live) > 1 else ""
    raise Conflict(
        f"floom node {node.id}{f' on {node.hostname}' if node.hostname else ''} (roles "
        f"{node.roles}) is serving {mask_password(url)}{others}: its last heartbeat was "
        f"{silent:.0f} s ago",
        hint="stop floom on the source first (the copy is one snapshot; runs written after it "
        "would be lost), then run migrate-store again; a node killed without a clean stop "
        f"counts as stopped once silent for its lease ({node.lease_seconds:.0f} s)",
        details={"node": node.id},
    )


def _refuse_non_empty(engine: Engine, url: str) -> None:
    with engine.connect() as conn:
        present = set(inspect(conn).get_table_names())
        for table in SQLModel.metadata.sorted_tables:
            if table.name not in present:
                continue
            if conn.execute(select(table).limit(1)).first() is not None:
                raise Conflict(
                    f"the target database {mask_password(url)} already holds floom data "
                    f"(table {table.name})",
                    hint="copy into a new, empty database: migrate-store never merges stores",
                )


def _open(url: str, *, migrated: bool = True) -> Engine:
    try:
        engine = make_engine(url)
    except (SQLAlchemyError, ValueError) as exc:
        raise InvalidRequest(
            f"cannot use the database URL {mask_password(url)}: {exc}",
            hint="write it like postgresql+psycopg://user:password@host:5432/floom",
        ) from exc
    if migrated:
        _migrate(engine, url)
    return engine


def _migrate(engine: Engine, url: str) -> None:
    try:
        migrate(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StoreUnavailable(
            f"cannot open the database {mask_password(url)}: {driver_reason(exc, url)}",
            hint="check the URL and that the database server is running and reachable",
        ) from exc


def _same_database(a: str, b: str) -> bool:
    return a.strip() == b.strip()
