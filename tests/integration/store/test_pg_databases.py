"""The reused test databases: a database handed to the next test is empty with its sequences
restarted and no session of the test before left on it; one whose schema changed is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.support.harness import PG_ADMIN_URL
from tests.support.processes.pg_databases import DatabasePool


@pytest.fixture
def pool(pg_available: bool, pg_template: str | None) -> Iterator[DatabasePool]:
    if not pg_available or pg_template is None:
        pytest.skip("PostgreSQL not reachable on 127.0.0.1:5432")
    own = DatabasePool(admin_url=PG_ADMIN_URL, template=pg_template)
    try:
        yield own
    finally:
        own.close()


def _exists(name: str) -> bool:
    with psycopg.connect(PG_ADMIN_URL) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        return row is not None


def test_a_database_given_back_is_emptied_and_handed_out_again(pool: DatabasePool) -> None:
    name = pool.take()
    lingering = psycopg.connect(pool.url(name))
    with psycopg.connect(pool.url(name), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO roles (id, name, description, created_at) VALUES ('rol_x', 'r', '', now())"
        )
        conn.execute("SELECT nextval('run_events_id_seq')")
        conn.execute("SELECT nextval('run_events_id_seq')")
    lingering.execute("SELECT * FROM roles FOR UPDATE")  # a test's open transaction

    pool.give_back(name)

    assert lingering.closed or lingering.broken or _session_ended(lingering)
    assert pool.take() == name
    with psycopg.connect(pool.url(name)) as conn:
        assert conn.execute("SELECT count(*) FROM roles").fetchone() == (0,)
        assert conn.execute("SELECT nextval('run_events_id_seq')").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


def _session_ended(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


def test_a_database_whose_schema_changed_is_dropped_not_reused(pool: DatabasePool) -> None:
    name = pool.take()
    with psycopg.connect(pool.url(name), autocommit=True) as conn:
        conn.execute("ALTER TABLE roles ADD COLUMN extra text")

    pool.give_back(name)

    assert not _exists(name)
    assert pool.take() != name


def test_a_database_the_test_dropped_is_forgotten(pool: DatabasePool) -> None:
    name = pool.take()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    pool.give_back(name)

    assert name not in pool.made
    assert pool.take() != name
