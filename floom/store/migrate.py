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
from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from floom.store.db import make_engine  # also registers every table on SQLModel.metadata

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine) -> None:
    """Bring the database to the current schema."""
    with engine.begin() as conn:
        tables = set(inspect(conn).get_table_names())
        cfg = alembic_config(conn)
        if "alembic_version" in tables:
            command.upgrade(cfg, "head")
            return
        # A new database (or one from before migrations existed): create what is missing,
        # then record that it is at the newest revision.
        SQLModel.metadata.create_all(conn)
        command.stamp(cfg, "head")


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
