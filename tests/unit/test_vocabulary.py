"""floom's closed sets of words (floom/vocabulary.py, floom.errors.RunErrorCode) are the ones
the tables hold and every surface shows: their values fit the columns that store them, the
catalogue explains each run error code, and floom's code names a status by its enum, never by
a bare string."""

from __future__ import annotations

from enum import StrEnum

import pytest
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import SQLModel

from floom import errors
from floom.errors import RunErrorCode
from floom.sandbox.base import SandboxUnavailable
from floom.store import agents, models
from floom.store import triggers as trigger_tables
from floom.vocabulary import (
    ApprovalKind,
    ApprovalStatus,
    RunStatus,
    RunTrigger,
    ToolCallStatus,
    TriggerKind,
)

# Each column that stores one of the closed sets, with its set.
COLUMNS: list[tuple[type[SQLModel], str, type[StrEnum]]] = [
    (models.Run, "status", RunStatus),
    (models.Run, "trigger", RunTrigger),
    (models.Run, "error_code", RunErrorCode),
    (trigger_tables.Trigger, "kind", TriggerKind),
    (agents.Approval, "kind", ApprovalKind),
    (agents.Approval, "status", ApprovalStatus),
    (agents.ToolCall, "status", ToolCallStatus),
]


@pytest.mark.parametrize(
    ("table", "name", "words"), COLUMNS, ids=[f"{t.__name__}.{n}" for t, n, _ in COLUMNS]
)
def test_each_word_fits_the_string_column_that_stores_it(
    table: type[SQLModel], name: str, words: type[StrEnum]
) -> None:
    column = table.__table__.c[name]  # type: ignore[attr-defined]
    # A plain VARCHAR on both databases: no native ENUM type, no CHECK, so the schema is that
    # of a string column whatever the enum holds.
    for dialect in (sqlite.dialect(), postgresql.dialect()):  # type: ignore[no-untyped-call]
        compiled = column.type.compile(dialect=dialect)
        assert compiled.startswith("VARCHAR("), (name, compiled)
    length = getattr(column.type, "length", None)
    assert isinstance(length, int), (name, column.type)
    assert max(len(word) for word in words) <= length


def test_every_run_error_code_is_explained_in_the_catalogue() -> None:
    listed = errors.run_error_catalogue()
    assert [entry["code"] for entry in listed] == [code.value for code in RunErrorCode]
    assert all(entry["meaning"].endswith(".") for entry in listed)


def test_a_run_error_code_named_like_a_refusal_is_that_refusals_code() -> None:
    # The same word means the same thing wherever a caller meets it.
    for code in RunErrorCode:
        cls = errors.error_class(code.value)
        if cls is not None:
            assert cls.code == code.value
    refusals: list[tuple[RunErrorCode, type[errors.FloomError]]] = [
        (RunErrorCode.STATE_CONFLICT, errors.StateConflict),
        (RunErrorCode.STATE_INVALID, errors.StateInvalid),
        (RunErrorCode.STATE_TOO_LARGE, errors.StateTooLarge),
        (RunErrorCode.SECRET_NAME_REFUSED, errors.SecretNameRefused),
        (RunErrorCode.INPUT_INVALID, errors.InputInvalid),
        (RunErrorCode.MODEL_ERROR, errors.ProviderError),
        (RunErrorCode.PROVIDER_AUTH, errors.ProviderAuthFailed),
        (RunErrorCode.PROVIDER_KEY_MISSING, errors.ProviderKeyMissing),
        (RunErrorCode.REPLAY_DIVERGED, errors.ReplayDiverged),
        (RunErrorCode.RECORDING_ENDED, errors.RecordingEnded),
        (RunErrorCode.TOOL_SOURCE_UNAVAILABLE, errors.SourceUnavailable),
        (RunErrorCode.SANDBOX_UNAVAILABLE, SandboxUnavailable),
    ]
    for code, refusal in refusals:
        assert refusal.code == code.value
