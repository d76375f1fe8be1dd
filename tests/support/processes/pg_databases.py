"""Migrated PostgreSQL databases for the tests, emptied and reused instead of cloned and
dropped for every test: CREATE DATABASE and DROP DATABASE each make PostgreSQL write and
sync a whole database or checkpoint, about 2 s a test on two cores; emptying one takes
milliseconds. A test that changed the schema (or dropped the database) gets its database
dropped, never reused."""

from __future__ import annotations

import contextlib
import time
import uuid

import psycopg

# One line per schema object outside the system schemas, and the migration revision: equal
# before and after a test, or the database is not handed to another test.
SCHEMA_FINGERPRINT = """
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
  SELECT 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text AS item
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  UNION ALL
  SELECT 'col ' || a.attrelid::regclass::text || '.' || a.attname || ' '
         || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' '
         || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped
     AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  UNION ALL
  SELECT 'con ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint
   WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL
  SELECT 'idx ' || pg_get_indexdef(indexrelid) FROM pg_index
   WHERE indrelid::regclass::text NOT LIKE 'pg\\_%'
  UNION ALL
  SELECT 'trg ' || tgrelid::regclass::text || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL
  SELECT 'fn ' || p.oid::regprocedure::text
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'rev ' || version_num FROM alembic_version
) AS schema
"""
TABLES = (
    "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
    "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
    "AND tablename <> 'alembic_version'"
)
SEQUENCES = (
    "SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences "
    "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
)
OTHER_SESSIONS = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"


class DatabasePool:
    """Databases cloned from `template` (a migrated one) for one test process."""

    def __init__(self, *, admin_url: str, template: str) -> None:
        self.admin_url = admin_url
        self.template = template
        self.idle: list[str] = []
        self.made: set[str] = set()
        with psycopg.connect(self.url(template)) as conn:
            self.fingerprint = _fingerprint(conn)

    def url(self, name: str) -> str:
        """The admin's URL of database `name` (psycopg form)."""
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def take(self) -> str:
        """The name of an empty migrated database that no other test is using."""
        if self.idle:
            return self.idle.pop()
        name = f"floom_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self.made.add(name)
        return name

    def give_back(self, name: str) -> None:
        """After the test: end its sessions, then empty the database for the next test, or
        drop it when its schema is no longer the template's (or it is gone)."""
        try:
            with psycopg.connect(self.url(name), autocommit=True) as conn:
                _end_other_sessions(conn, name)
                if _fingerprint(conn) != self.fingerprint:
                    raise ValueError("the test changed the schema")
                _empty(conn)
        except (psycopg.Error, ValueError):  # changed or gone: never handed out again
            self.drop(name)
            return
        self.idle.append(name)

    def drop(self, name: str) -> None:
        self.made.discard(name)
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        for name in list(self.made):
            self.drop(name)
        self.idle.clear()


def _fingerprint(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    row = conn.execute(SCHEMA_FINGERPRINT).fetchone()
    assert row is not None
    return str(row[0])


def _end_other_sessions(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    """What DROP DATABASE ... WITH (FORCE) did: no session of the test (a node it left
    behind, a pooled connection) may see or lock the next test's data."""
    deadline = time.monotonic() + 10
    while pids := [row[0] for row in conn.execute(OTHER_SESSIONS, (name,))]:
        for pid in pids:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if time.monotonic() > deadline:
            raise ValueError(f"sessions {pids} of {name} did not end")
        time.sleep(0.02)


def _empty(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Delete every row but the migration revision and restart the sequences. DELETE, not
    TRUNCATE: TRUNCATE makes new files for each table, 20-50 times slower here; foreign
    keys are not checked while emptying everything (replica role)."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for (table,) in conn.execute(TABLES).fetchall():
            conn.execute(f"DELETE FROM {table}")
        for (sequence,) in conn.execute(SEQUENCES).fetchall():
            conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
