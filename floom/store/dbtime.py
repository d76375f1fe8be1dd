"""The database's clock: one time for every node that shares the store, whatever each node's
own clock says. What orders or judges across nodes (the alert watch, delivery claims, when a
node was last heard) reads and writes it, so a node whose clock runs minutes ahead or behind
neither skips nor repeats what another node wrote."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, bindparam, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session

from floom.store.models import UTCDateTime


class db_now(FunctionElement[datetime]):
    """The database's time now, `seconds` on: usable wherever a timestamp column is
    (compared with one, or written to one)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__(bindparam(None, float(seconds), type_=Float()))


@compiles(db_now, "postgresql")
def _postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"(clock_timestamp() + {seconds} * interval '1 second')"


@compiles(db_now, "sqlite")
def _sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    # As SQLAlchemy stores a SQLite timestamp (UTC, six digits of fraction): the two
    # compare as text, and it reads back as one.
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {seconds} || ' seconds') || '000')"


def database_now(s: Session) -> datetime:
    """The database's time (one statement)."""
    at: datetime = s.execute(select(db_now())).scalar_one()
    return at
