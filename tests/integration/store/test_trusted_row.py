"""store.models.trusted_row builds the same row object as the model's constructor (the run a
POST queues and the run a claim takes are built with it), and such a row is stored and read
back like any other."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import SQLModel

from floom.errors import NotFound
from floom.services.runs import lifecycle as runs
from floom.store.db import make_engine, session_scope
from floom.store.models import Run, trusted_row
from floom.vocabulary import RunStatus, RunTrigger

VALUES: dict[str, Any] = {
    "id": "run_trusted_1",
    "worker_name": "hello",
    "version_id": "v1",
    "status": RunStatus.QUEUED,
    "trigger": RunTrigger.API,
    "inputs_json": '{"name": "x"}',
    "max_attempts": 3,
    "scheduled_for": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
}


def test_a_trusted_row_equals_the_constructed_one_except_for_its_creation_time() -> None:
    built = trusted_row(Run, VALUES).model_dump()
    constructed = Run(**VALUES).model_dump()
    assert built.pop("created_at") <= constructed.pop("created_at")
    assert built == constructed
    assert built["attempt"] == 1
    assert built["cancel_requested"] is False


def test_a_trusted_row_is_inserted_updated_and_read_back(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        SQLModel.metadata.create_all(engine)
        with session_scope(engine, write=True) as s:
            s.add(trusted_row(Run, VALUES))
        with session_scope(engine) as s:
            stored = s.get(Run, VALUES["id"])
            assert stored is not None
            got = stored.model_dump()
        assert {k: got[k] for k in VALUES} == VALUES
        # The closed sets' columns read back as their enums' members (store.models.Words).
        assert type(got["status"]) is RunStatus
        assert type(got["trigger"]) is RunTrigger
        assert got["attempt"] == 1
        assert got["sandbox_seconds"] == 0.0
        # A row built from stored values (as a claim builds it) updates that row.
        claimed = trusted_row(Run, got)
        with session_scope(engine, write=True) as s:
            merged = s.merge(claimed)
            merged.status = RunStatus.RUNNING
        with session_scope(engine) as s:
            stored = s.get(Run, VALUES["id"])
            assert stored is not None
            assert stored.status == "running"
    finally:
        engine.dispose()


def test_a_peeked_run_is_the_stored_row_and_changing_it_writes_nothing(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        SQLModel.metadata.create_all(engine)
        with session_scope(engine, write=True) as s:
            s.add(trusted_row(Run, VALUES))
        with session_scope(engine, write=True) as s:
            peeked = runs.peek_run(s, VALUES["id"])
            assert peeked.model_dump() == runs.run_in_session(s, VALUES["id"]).model_dump()
            peeked.status = RunStatus.CANCELLED
        with session_scope(engine) as s:
            assert runs.run_in_session(s, VALUES["id"]).status == "queued"
            with pytest.raises(NotFound):
                runs.peek_run(s, "run_missing")
    finally:
        engine.dispose()
