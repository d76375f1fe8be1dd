"""Unit tests need no server, database or sandbox: a test here that asks for a
fixture that starts one fails at collection, naming it (move it to integration/ or e2e/)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
# The shared fixtures that open a database, start a server or need one.
HEAVY = {
    "api",
    "ctx",
    "database_url",
    "empty_database_url",
    "pg_available",
    "pg_databases",
    "pg_template",
    "server",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        heavy = sorted(HEAVY & set(getattr(item, "fixturenames", ())))
        if heavy and item.path.is_relative_to(HERE):
            raise pytest.UsageError(
                f"{item.nodeid} is a unit test but uses {', '.join(heavy)}: "
                "move it to tests/integration/ or tests/e2e/"
            )
