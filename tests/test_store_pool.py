"""PostgreSQL connections are checked before use only when they sat idle (bench/bench_runs.py
measures the round trips this saves), and a connection that died while idle (a database
restart, an idle timeout) is replaced before anyone uses it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from floom.store import db
from floom.store.db import make_engine, session_scope
from tests.conftest import PG_ADMIN_URL


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database of its own on the test PostgreSQL server (no tables needed)."""
    name = f"floom_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_connection_that_died_while_idle_is_replaced_before_use(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(pg_url)
    try:
        with session_scope(engine) as s:
            first = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        monkeypatch.setattr(db, "IDLE_PING_SECONDS", 0.0)  # the pooled one now counts as idle
        with session_scope(engine) as s:
            second = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
    finally:
        engine.dispose()
    assert second != first
