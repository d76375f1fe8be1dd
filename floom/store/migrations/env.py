"""Alembic environment: floom's tables, on the connection floom hands over."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import floom.store.db  # noqa: F401 - registers every table on SQLModel.metadata

config = context.config
target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
