"""Schema migrations (Alembic). A new database gets the whole schema and is stamped at head;
an existing one is upgraded. Every change to a table needs a revision in migrations/versions
(`python -m floom.store.migrate revision "what changed"`); a test holds models and
migrations equal.

Alembic itself (about 11 MiB resident) loads only when a database is behind: a new database
is created from the models and stamped, and one at head is left alone, both with plain SQL;
the revisions are read from the migration files' `revision = ...` lines.
"""

from __future__ import annotations

import re
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from floom import __version__
from floom.errors import StoreNewerThanNode
from floom.hints import act, told
from floom.store.db import (  # also registers every table on SQLModel.metadata
    MIGRATION_LOCK,
    is_postgres,
    make_engine,
)
from floom.store.statements.lock_waits import UNBOUNDED_WAITS

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "alembic_version"
# `revision = "0005"` or `down_revision: str | None = "0004"` (Alembic's newer template).
_REVISION = re.compile(
    r"""^(down_revision|revision)\s*(?::[^=\n]*)?=\s*(None|['"]([^'"]+)['"])""", re.M
)


class Revisions(NamedTuple):
    """The migration files' revisions: every one, and the newest (the one none revises)."""

    known: frozenset[str]
    head: str


@cache
def revisions() -> Revisions:
    """Read from migrations/versions without Alembic (a test holds it equal to Alembic's)."""
    known, revised = set(), set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        found = {m.group(1): m.group(3) for m in _REVISION.finditer(path.read_text())}
        if found.get("revision"):
            known.add(found["revision"])
            if found.get("down_revision"):
                revised.add(found["down_revision"])
    (head,) = known - revised  # one line of revisions, as floom's are
    return Revisions(frozenset(known), head)


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config  # Alembic only when it migrates

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine) -> None:
    """Bring the database to the current schema. Nodes starting at once take turns (a
    PostgreSQL advisory lock held until this transaction ends): the first creates or
    upgrades the schema, the others find it done."""
    with engine.begin() as conn:
        if is_postgres(engine):
            # A schema change waits for the other nodes' transactions on its tables, and
            # nodes starting meanwhile wait for it, however long either takes.
            conn.exec_driver_sql(UNBOUNDED_WAITS)
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        tables = set(inspect(conn).get_table_names())
        if VERSION_TABLE in tables:
            current = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
            if _refuse_newer_schema(list(current)) == [revisions().head]:
                return
            from alembic import command  # Alembic only when it migrates

            command.upgrade(alembic_config(conn), "head")
            return
        # A new database (or one from before migrations existed): create what is missing,
        # then record that it is at the newest revision (what `alembic stamp head` writes).
        SQLModel.metadata.create_all(conn)
        version = _version_table()
        version.create(conn)
        conn.execute(version.insert().values(version_num=revisions().head))


def _version_table() -> Table:
    """Alembic's version table, as Alembic creates it."""
    return Table(
        VERSION_TABLE,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
    )


def _refuse_newer_schema(current: list[str]) -> list[str]:
    """The database's revisions, unless a newer floom migrated it (during a rolling
    upgrade): a node started on it says so, instead of failing inside Alembic."""
    unknown = [revision for revision in current if revision not in revisions().known]
    if unknown:
        raise StoreNewerThanNode(
            f"the database is at schema revision {unknown[0]}, which this floom "
            f"({__version__}) does not know: a newer floom has migrated it",
            hint=told(
                "upgrade this node to the version the other nodes run (",
                act("nodes"),
                " lists each node's version)",
            ),
        )
    return current


def _revision(message: str) -> None:
    """Write a new revision by comparing the models with a scratch database at head."""
    from alembic import command  # Alembic only when it migrates

    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/scratch.db")
        with engine.begin() as conn:
            cfg = alembic_config(conn)
            command.upgrade(cfg, "head")
            command.revision(cfg, message=message, autogenerate=True)
        engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "revision":
        sys.exit('usage: python -m floom.store.migrate revision "what changed"')
    _revision(sys.argv[2])
