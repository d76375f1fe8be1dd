"""Schema migrations (Alembic). A new database gets the whole schema and is stamped at head;
an existing one is upgraded. Every change to a table needs a revision in migrations/versions
(`python -m floom.store.migrate revision "what changed"`); a test holds models and
migrations equal."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from floom import __version__
from floom.errors import StoreNewerThanNode
from floom.store.db import (  # also registers every table on SQLModel.metadata
    MIGRATION_LOCK,
    is_postgres,
    make_engine,
)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
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
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        tables = set(inspect(conn).get_table_names())
        cfg = alembic_config(conn)
        if "alembic_version" in tables:
            _refuse_newer_schema(conn, cfg)
            command.upgrade(cfg, "head")
            return
        # A new database (or one from before migrations existed): create what is missing,
        # then record that it is at the newest revision.
        SQLModel.metadata.create_all(conn)
        command.stamp(cfg, "head")


def _refuse_newer_schema(conn: Connection, cfg: Config) -> None:
    """A node started on a database that a newer floom migrated (during a rolling upgrade)
    says so, instead of failing inside Alembic."""
    current = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    known = {script.revision for script in ScriptDirectory.from_config(cfg).walk_revisions()}
    unknown = [revision for revision in current if revision not in known]
    if unknown:
        raise StoreNewerThanNode(
            f"the database is at schema revision {unknown[0]}, which this floom "
            f"({__version__}) does not know: a newer floom has migrated it",
            hint="upgrade this node to the version the other nodes run "
            "(`floom nodes` lists each node's version)",
        )


def _revision(message: str) -> None:
    """Write a new revision by comparing the models with a scratch database at head."""
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
