"""The run path's hot statements (floom/store/statements/hot.py) write and return what
SQLAlchemy's own path does with the same statement, on both stores: each runs both ways in a
transaction that is rolled back, and the rows it returned and the tables it wrote are
compared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import select
from sqlalchemy.engine import Connection

from floom.bundle import read_folder
from floom.engine import queue
from floom.errors import StoreUnavailable
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle, logs, records
from floom.services.runs.rules import claimed_fields
from floom.services.workers import versions as workers
from floom.store import signals
from floom.store.blobs import rows as blob_rows
from floom.store.db import read_connection
from floom.store.models import Artifact, Blob, Run, RunEvent, trusted_row, utcnow
from floom.store.statements import hot
from floom.vocabulary import RunStatus
from tests.support.harness import make_worker

MANIFEST = """\
name: adder
entry: run.py
inputs:
  a: {type: integer}
retries: {count: 2, backoff_seconds: 0}
"""

NOW = utcnow()
LATER = NOW + timedelta(seconds=5)


@dataclass
class Stage:
    """What each case reads from: a deployed worker, two queued runs (one of them with
    an artifact) and a stored blob."""

    ctx: Context
    version_id: str
    queued: list[Run]
    digest: str


@dataclass(frozen=True)
class Case:
    statement: hot.Statement
    params: Callable[[Stage], Any]
    tables: tuple[type[Any], ...] = ()
    # Columns a rolled-back write still moves on PostgreSQL (a sequence's next value).
    serial: tuple[str, ...] = ()
    postgres_only: bool = False
    name: str = field(default="")


def _claim_params(_: Stage) -> dict[str, Any]:
    return {"now": NOW, **claimed_fields(node_id="node-a", lease_seconds=30, now=NOW)}


def _new_run(stage: Stage) -> dict[str, Any]:
    run = trusted_row(
        Run,
        {
            "id": "run_hot_new",
            "worker_name": "adder",
            "version_id": stage.version_id,
            "status": RunStatus.QUEUED,
            "trigger": "api",
            "inputs_json": '{"a": 1, "text": "caf\\u00e9 \\u2603"}',
            "max_attempts": 3,
            "created_by": "key:k_1",
            "created_at": NOW,
        },
    )
    return {name: run.__dict__[name] for name in lifecycle._run_columns()}


def _finish_params(stage: Stage) -> dict[str, Any]:
    run = stage.queued[0]
    claimed = trusted_row(Run, {**run.__dict__, "status": RunStatus.RUNNING})
    claimed.__dict__.pop("_sa_instance_state", None)
    outcome = queue.Outcome(status=RunStatus.SUCCEEDED, outputs={"sum": 3}, exit_code=0)
    values, _, _, _ = queue._end_values(claimed, outcome, now=LATER, backoff=0, exponential=True)
    return {
        "values": values,
        "params": {
            **values,
            "held_id": run.id,
            "held_owner": "node-a",
            "held_attempt": 1,
            "held_epoch": 1,
            "sandbox_seconds_added": 0.25,
        },
    }


def _lines(stage: Stage) -> list[dict[str, Any]]:
    return [
        {"run_id": stage.queued[1].id, "attempt": 1, "ts": LATER, "stream": s, "line": line}
        for s, line in (("stdout", "one"), ("stderr", "two \u2603"), ("system", "three"))
    ]


CASES = [
    Case(workers.LOCK_WORKER, lambda st: {"name": "adder", "version_id": st.version_id}),
    Case(lifecycle.ANY_RUNNABLE, lambda _: {"now": NOW}),
    Case(lifecycle.RUN_INSERT, _new_run, tables=(Run,)),
    Case(lifecycle.RUN_BY_ID, lambda st: {"id": st.queued[0].id}),
    Case(records.ARTIFACTS_OF_RUN, lambda st: {"run_id": st.queued[1].id}),
    Case(
        logs.EVENTS_INSERT,
        lambda st: [
            {**line, "run_id": "run_hot_bare", "seq": seq} for seq, line in enumerate(_lines(st), 1)
        ],
        tables=(RunEvent,),
        serial=("id",),
    ),
    Case(logs.EVENTS_INSERT_NEXT, _lines, tables=(RunEvent,), serial=("id",)),
    Case(
        logs.EVENTS_INSERT_PG,
        lambda st: {
            "run_id": st.queued[1].id,
            "attempts": [1, 1],
            "ts": [LATER, LATER],
            "streams": ["stdout", "system"],
            "lines": ["one", "two"],
        },
        tables=(RunEvent,),
        serial=("id",),
        postgres_only=True,
    ),
    Case(logs.EVENTS_LOCK, lambda st: {"run_id": st.queued[0].id}, postgres_only=True),
    Case(
        signals._NOTIFY, lambda _: {"channel": "floom_hot_test", "payload": "x"}, postgres_only=True
    ),
    Case(queue._LOOK, lambda _: {"now": NOW}),
    Case(queue._CLAIM, _claim_params, tables=(Run,)),
    Case(
        queue.ARTIFACTS_INSERT,
        lambda st: [
            {
                "run_id": st.queued[0].id,
                "name": name,
                "size": 3,
                "digest": st.digest,
                "content_type": "text/plain",
                "created_at": LATER,
            }
            for name in ("b.txt", "a.txt")
        ],
        tables=(Artifact,),
        serial=("id",),
    ),
    Case(
        queue.ARTIFACTS_INSERT,
        # A list of one set (a run with one artifact): RETURNING's rows still come back.
        lambda st: [
            {
                "run_id": st.queued[0].id,
                "name": "only.txt",
                "size": 3,
                "digest": st.digest,
                "content_type": "text/plain",
                "created_at": LATER,
            }
        ],
        tables=(Artifact,),
        serial=("id",),
        name="artifacts.insert-one",
    ),
    Case(blob_rows.BLOB_STORED, lambda st: {"digest": st.digest}),
]


def _finish_case(stage: Stage) -> tuple[hot.Statement, dict[str, Any]]:
    made = _finish_params(stage)
    return queue._finish_statement(tuple(made["values"])), made["params"]


@pytest.fixture
def stage(ctx: Context, tmp_path: Path) -> Stage:
    folder = make_worker(tmp_path / "adder", MANIFEST, {"run.py": "# not run\n"})
    version = workers.deploy(
        ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=1 << 20).to_archive()
    ).version
    queued = [
        lifecycle.create_run(ctx, caller=SYSTEM, worker_name="adder", inputs={"a": n})
        for n in (1, 2)
    ]
    digest = "d" * 64
    with ctx.engine.begin() as conn:
        conn.execute(
            Blob.__table__.insert(),  # type: ignore[attr-defined]
            {"digest": digest, "size": 3, "data": b"abc", "created_at": NOW, "sha256": digest},
        )
        conn.execute(
            Artifact.__table__.insert(),  # type: ignore[attr-defined]
            {
                "run_id": queued[1].id,
                "name": "out.txt",
                "size": 3,
                "digest": digest,
                "content_type": "text/plain",
                "created_at": NOW,
            },
        )
        # A run with no events yet, as the queueing transaction has inserted it.
        conn.execute(lifecycle._run_insert(), {**_new_run_values(version.id), "id": "run_hot_bare"})
    return Stage(ctx, version.id, queued, digest)


def _new_run_values(version_id: str) -> dict[str, Any]:
    return _new_run(Stage(None, version_id, [], ""))  # type: ignore[arg-type]


def _typed(rows: list[dict[str, Any]], serial: tuple[str, ...]) -> list[list[Any]]:
    """Rows as their keys, values and the values' types (an aware datetime is not a naive one,
    a StrEnum member is compared as the string it is)."""
    return [
        [(key, type(value).__name__, value) for key, value in row.items() if key not in serial]
        for row in rows
    ]


def _snapshot(conn: Connection, tables: tuple[type[Any], ...], serial: tuple[str, ...]) -> Any:
    found = {}
    for model in tables:
        table = model.__table__
        keys = list(table.primary_key.columns)
        rows = conn.execute(select(table).order_by(*keys)).all()
        found[table.name] = _typed([dict(row._mapping) for row in rows], serial)
    return found


def _both_ways(
    ctx: Context,
    statement: hot.Statement,
    params: Any,
    tables: tuple[type[Any], ...],
    serial: tuple[str, ...],
) -> tuple[Any, Any]:
    seen = []
    for way in (statement.sqlalchemy_rows, statement.rows):
        with ctx.engine.connect() as conn:
            conn.begin()
            returned = way(conn, params)
            seen.append((_typed(returned, serial), _snapshot(conn, tables, serial)))
            conn.rollback()
    return seen[0], seen[1]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name or c.statement.name)
def test_a_hot_statement_writes_and_returns_what_sqlalchemy_does(
    ctx: Context, stage: Stage, case: Case
) -> None:
    if case.postgres_only and ctx.engine.dialect.name != "postgresql":
        pytest.skip("a PostgreSQL statement")
    by_sqlalchemy, by_driver = _both_ways(
        ctx, case.statement, case.params(stage), case.tables, case.serial
    )
    assert by_driver == by_sqlalchemy
    # Each case finds something to return or to write.
    assert by_driver[0] or by_driver[1] or case.statement in (logs.EVENTS_LOCK, signals._NOTIFY)


def test_the_end_of_an_attempt_writes_and_returns_what_sqlalchemy_does(
    ctx: Context, stage: Stage
) -> None:
    with ctx.engine.begin() as conn:
        claimed = queue._CLAIM.first(conn, _claim_params(stage))
    assert claimed is not None
    assert claimed["id"] == stage.queued[0].id
    statement, params = _finish_case(stage)
    by_sqlalchemy, by_driver = _both_ways(ctx, statement, params, (Run,), ())
    assert by_driver == by_sqlalchemy
    returned = by_driver[0]
    assert len(returned) == 1
    assert ("status", "RunStatus", RunStatus.SUCCEEDED) in returned[0]


def test_every_hot_statement_has_a_case() -> None:
    covered = {case.statement.name for case in CASES} | {"queue.finish"}
    assert covered >= hot.NAMES


def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(ctx: Context, stage: Stage) -> None:
    """A duplicate key is SQLAlchemy's IntegrityError either way (so callers' handlers hold)."""
    params = {**_new_run(stage), "id": stage.queued[0].id}
    raised = []
    for way in (lifecycle.RUN_INSERT.sqlalchemy_rows, lifecycle.RUN_INSERT.rows):
        with ctx.engine.connect() as conn:
            conn.begin()
            with pytest.raises(sa_exc.DBAPIError) as caught:
                way(conn, params)
        raised.append(type(caught.value))
    assert raised[0] is raised[1] is sa_exc.IntegrityError


def test_a_lost_connection_is_store_unavailable_and_is_not_reused(
    ctx: Context, stage: Stage
) -> None:
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("a server connection to lose")
    with pytest.raises(StoreUnavailable):
        _read_after_losing_its_server(ctx, stage.queued[0].id)
    # The pool dropped the lost connection: the next read works.
    assert _peek(ctx, stage.queued[0].id).id == stage.queued[0].id


def test_a_lost_connection_is_invalidated_as_sqlalchemy_does_it(ctx: Context, stage: Stage) -> None:
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("a server connection to lose")
    seen = [
        _lose_and_read(ctx, way, stage.queued[0].id)
        for way in (lifecycle.RUN_BY_ID.sqlalchemy_rows, lifecycle.RUN_BY_ID.rows)
    ]
    assert seen[0] == seen[1] == (sa_exc.OperationalError, True, True)


def _lose_and_read(ctx: Context, way: Callable[..., Any], run_id: str) -> tuple[Any, ...]:
    """The error a read on a connection whose server went away raises, whether it says the
    connection was invalidated, and whether it was."""
    with ctx.engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.rollback()
        with ctx.engine.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            other.commit()
        with pytest.raises(sa_exc.DBAPIError) as caught:
            way(conn, {"id": run_id})
        return type(caught.value), caught.value.connection_invalidated, conn.invalidated


def _read_after_losing_its_server(ctx: Context, run_id: str) -> None:
    with read_connection(ctx.engine) as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with ctx.engine.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            other.commit()
        lifecycle.peek_run(conn, run_id)


def _peek(ctx: Context, run_id: str) -> Run:
    with read_connection(ctx.engine) as conn:
        return lifecycle.peek_run(conn, run_id)
