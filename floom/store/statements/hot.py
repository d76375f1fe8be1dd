"""The statements of every run's life (queueing, the claim, the end, a waiter's read) run on
the database driver's own connection, with their SQL compiled once per dialect.

Each is an ordinary SQLAlchemy Core statement, built where it belongs and wrapped here as a
`Statement`. Run on a plain `Connection` (store.db.write_connection, read_connection), it
skips SQLAlchemy's path for each statement (an execution context, the compiled cache's
lookup, a cursor result and its rows): that path was about half of a run's store time, spent
mostly inside SQLite's write lock, which every other writer waits for. What that path did
and a caller can see is kept: the same SQL and bound values (the types' bind and result
processors, the engine's cursor events, floom's storable text among them), the
connection's transaction begun as SQLAlchemy would (SQLite's BEGIN), and the driver's
errors raised as SQLAlchemy raises them (so a locked or lost database still reaches
callers as StoreUnavailable, and a lost connection is invalidated). On an ORM `Session`
(a trigger's step) a statement takes SQLAlchemy's path.

tests/integration/store/test_hot_statements.py runs every statement both ways on both
stores and compares what each wrote and returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.expression import Select, TextClause
from sqlmodel import Session

Params = Mapping[str, Any]
Row = dict[str, Any]

# Every Statement's name, for the equivalence test to check that it covers them all.
NAMES: set[str] = set()


@dataclass(frozen=True)
class _Compiled:
    sql: str
    positional: bool
    # Each bind's name in the SQL's order (positional) or once each (named), with the value
    # it has when the caller gives none (a literal's) and its type's bind processor.
    names: tuple[str, ...]
    defaults: Mapping[str, Any]
    required: frozenset[str]
    processors: Mapping[str, Callable[[Any], Any]]
    # The result's keys (as SQLAlchemy's rows name them) and their types, in column order.
    keys: tuple[str, ...]
    types: tuple[Any, ...]


class Statement:
    """A Core statement (made by `build`, once) run on the driver's connection.

    `keys`: the columns an INSERT without values binds (SQLAlchemy compiles such an INSERT
    for the keys of the parameters it is given). Statements with expanding parameters (IN
    lists) are refused when compiled: their SQL depends on each call's values.
    """

    def __init__(
        self, name: str, build: Callable[[], Any], *, keys: Sequence[str] | None = None
    ) -> None:
        self.name = name
        self._build = build
        self._keys = list(keys) if keys is not None else None
        self._statement: Any = None
        self._compiled: dict[str, _Compiled] = {}
        # Result processors per dialect and the driver's column type codes (PostgreSQL's
        # numeric processors depend on the type the server said it sent).
        self._results: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]] = {}
        self._lock = threading.Lock()
        NAMES.add(name)

    @property
    def statement(self) -> Any:
        """The SQLAlchemy statement, as the ORM path and the equivalence test run it."""
        if self._statement is None:
            self._statement = self._build()
        return self._statement

    def rows(self, s: Connection | Session, params: Params | Sequence[Params]) -> list[Row]:
        """The rows the statement returns (none for one without a result), each as a dict
        keyed as SQLAlchemy's rows are. A list of parameter sets runs it once for each, in
        order (an executemany where it returns nothing)."""
        if isinstance(s, Session):
            return self.sqlalchemy_rows(s, params)
        return _execute(s, self, params)

    def first(self, s: Connection | Session, params: Params) -> Row | None:
        found = self.rows(s, params)
        return found[0] if found else None

    def sqlalchemy_rows(
        self, s: Connection | Session, params: Params | Sequence[Params]
    ) -> list[Row]:
        """The same statement through SQLAlchemy's own path."""
        result: Any = s.execute(self.statement, params)
        if not result.returns_rows:
            return []
        return [dict(row._mapping) for row in result]

    def compiled(self, dialect: Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is None:
            with self._lock:
                found = self._compiled.get(dialect.name)
                if found is None:
                    found = self._compiled[dialect.name] = _compile(
                        self.statement, dialect, self._keys, self.name
                    )
        return found

    def result_processors(
        self, dialect: Dialect, compiled: _Compiled, codes: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        key = (dialect.name, codes)
        found = self._results.get(key)
        if found is None:
            found = tuple(
                type_.dialect_impl(dialect).result_processor(dialect, code)
                for type_, code in zip(compiled.types, codes, strict=True)
            )
            self._results[key] = found
        return found


def _compile(statement: Any, dialect: Dialect, keys: list[str] | None, name: str) -> _Compiled:
    compiled: Any = statement.compile(dialect=dialect, column_keys=keys)
    sql = str(compiled.string)
    if "POSTCOMPILE" in sql or compiled.escaped_bind_names:
        raise ValueError(f"hot statement {name}: its SQL depends on its values; not compiled once")
    binds = {bind_name: bind for bind, bind_name in compiled.bind_names.items()}
    names = tuple(compiled.positiontup) if compiled.positional else tuple(binds)
    processors = {}
    for bind_name, bind in binds.items():
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            processors[bind_name] = processor
    required = frozenset(bind_name for bind_name, bind in binds.items() if bind.required)
    columns: list[tuple[str, Any]] = []
    if isinstance(statement, Select):
        columns = [(str(key), column.type) for key, column in statement.selected_columns.items()]
    elif isinstance(statement, UpdateBase):
        columns = [(str(key), column.type) for key, column in statement.exported_columns.items()]
    elif not isinstance(statement, TextClause):
        raise TypeError(f"hot statement {name}: a {type(statement).__name__} is not supported")
    return _Compiled(
        sql=sql,
        positional=bool(compiled.positional),
        names=names,
        defaults=compiled.construct_params(_check=False),
        required=required,
        processors=processors,
        keys=tuple(key for key, _ in columns),
        types=tuple(type_ for _, type_ in columns),
    )


def _bound(compiled: _Compiled, params: Params) -> Any:
    missing = compiled.required - params.keys()
    if missing:
        raise sa_exc.InvalidRequestError(
            f"A value is required for bind parameter {sorted(missing)[0]!r}"
        )
    processors = compiled.processors
    values = []
    for name in compiled.names:
        value = params[name] if name in params else compiled.defaults.get(name)
        processor = processors.get(name)
        values.append(processor(value) if processor is not None else value)
    if compiled.positional:
        return tuple(values)
    return dict(zip(compiled.names, values, strict=True))


def _execute(
    conn: Connection, statement: Statement, params: Params | Sequence[Params]
) -> list[Row]:
    dialect = conn.dialect
    compiled = statement.compiled(dialect)
    many = not isinstance(params, Mapping)
    sets: Sequence[Params] = params if many else [params]  # type: ignore[list-item,assignment]
    if not sets:
        return []
    if not conn.in_transaction():
        conn.begin()  # what SQLAlchemy's first execute does (on SQLite: its BEGIN)
    raw = conn.connection.driver_connection
    assert raw is not None
    if compiled.keys and many:
        # A result for each set: one statement each, in order (an executemany returns no
        # rows: sqlite3 refuses RETURNING in one, psycopg drops them), a list of one too.
        found: list[Row] = []
        for one in sets:
            found.extend(_run(conn, raw, statement, compiled, _bound(compiled, one), False))
        return found
    bound = [_bound(compiled, one) for one in sets] if many else _bound(compiled, sets[0])
    return _run(conn, raw, statement, compiled, bound, many)


def _run(
    conn: Connection, raw: Any, statement: Statement, compiled: _Compiled, bound: Any, many: bool
) -> list[Row]:
    sql = compiled.sql
    cursor = raw.cursor()
    try:
        # The engine's cursor events, as SQLAlchemy sends them (floom's storable text is one;
        # tests watch statements through them). No execution context: there is none.
        for listener in conn.dispatch.before_cursor_execute:
            sql, bound = listener(conn, cursor, sql, bound, None, many)
        if many:
            cursor.executemany(sql, bound)
        else:
            cursor.execute(sql, bound)
        conn.dispatch.after_cursor_execute(conn, cursor, sql, bound, None, many)
        if cursor.description is None:
            return []
        fetched = cursor.fetchall()
        described = cursor.description
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _as_sqlalchemy_error(conn, raw, cursor, sql, bound, exc, many) from exc
    finally:
        cursor.close()
    if compiled.keys:
        keys = compiled.keys
        codes = tuple(column[1] for column in described)
        processors = statement.result_processors(conn.dialect, compiled, codes)
    else:  # a text() statement: its columns as the driver names them, untyped
        keys = tuple(column[0] for column in described)
        processors = (None,) * len(keys)
    return [
        {
            key: (processor(value) if processor is not None else value)
            for key, processor, value in zip(keys, processors, row, strict=True)
        }
        for row in fetched
    ]


def _as_sqlalchemy_error(
    conn: Connection, raw: Any, cursor: Any, sql: str, bound: Any, exc: Any, many: bool
) -> Exception:
    """The driver's error as SQLAlchemy's path raises it (OperationalError, IntegrityError,
    ...); a lost connection is invalidated, so the pool does not hand it out again."""
    dialect = conn.dialect
    lost = dialect.is_disconnect(exc, raw, cursor)
    error: Exception = sa_exc.DBAPIError.instance(
        sql,
        bound,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=conn.engine.hide_parameters,
        dialect=dialect,
        ismulti=many,
        connection_invalidated=lost,
    )
    if lost:
        conn.invalidate(exc)
    return error
