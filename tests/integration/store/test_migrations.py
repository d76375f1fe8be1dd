"""The migrations build exactly the schema the models describe, on SQLite and PostgreSQL; a
new database and one at head are handled without loading Alembic, one behind is upgraded."""

from __future__ import annotations

import subprocess
import sys

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from floom.store.db import make_engine
from floom.store.migrate import alembic_config, migrate, revisions


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


def test_the_revisions_read_from_the_files_are_alembics() -> None:
    scripts = ScriptDirectory.from_config(alembic_config())
    assert revisions().head == scripts.get_current_head()
    assert revisions().known == {script.revision for script in scripts.walk_revisions()}


def test_a_new_database_and_one_at_head_are_migrated_without_loading_alembic(
    empty_database_url: str,
) -> None:
    probe = (
        "import sys\n"
        "from floom.store.db import make_engine\n"
        "from floom.store.migrate import migrate\n"
        f"engine = make_engine({empty_database_url!r})\n"
        "migrate(engine)\n"
        "migrate(engine)\n"
        "engine.dispose()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    engine = make_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == revisions().head
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": False}),
                SQLModel.metadata,
            )
        assert diff == []
    finally:
        engine.dispose()


def test_a_database_behind_is_upgraded_to_head(empty_database_url: str) -> None:
    engine = make_engine(empty_database_url)
    head = ScriptDirectory.from_config(alembic_config()).get_revision(revisions().head)
    previous = head.down_revision if head else None
    assert isinstance(previous, str)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), previous)
        migrate(engine)
        with engine.connect() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
            assert list(version) == [revisions().head]
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": False}),
                SQLModel.metadata,
            )
        assert diff == []
    finally:
        engine.dispose()
