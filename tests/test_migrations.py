"""The migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlmodel import SQLModel

from floom.store.db import make_engine
from floom.store.migrate import alembic_config, migrate


def test_upgrading_an_empty_database_gives_the_models_schema(empty_database_url: str) -> None:
    engine = make_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": False}),
                SQLModel.metadata,
            )
        assert diff == [], (
            "the models changed without a migration; write one with "
            '`python -m floom.store.migrate revision "what changed"`'
        )
    finally:
        engine.dispose()


def test_migrating_twice_changes_nothing_and_records_the_revision(
    empty_database_url: str,
) -> None:
    engine = make_engine(empty_database_url)
    try:
        migrate(engine)
        migrate(engine)
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {"runs", "workers", "versions", "alembic_version"} <= tables
            current = MigrationContext.configure(conn).get_current_revision()
        assert current == ScriptDirectory.from_config(alembic_config()).get_current_head()
    finally:
        engine.dispose()
