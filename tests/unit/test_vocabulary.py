"""floom's closed sets of words (floom/vocabulary.py, floom.errors.RunErrorCode) are the ones
the tables hold and every surface shows: their values fit the columns that store them, the
catalogue explains each run error code, and floom's code names a status by its enum, never by
a bare string."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import SQLModel

from floom import errors
from floom.cli.commands.approvals import APPROVAL_STYLES, TOOL_STYLES
from floom.cli.console import STATUS_STYLES
from floom.errors import RunErrorCode
from floom.sandbox.base import SandboxUnavailable
from floom.schemas.common import OneOf, RunStatusWord
from floom.store import agents, models
from floom.store import handoffs as handoff_tables
from floom.store import triggers as trigger_tables
from floom.vocabulary import (
    ApprovalKind,
    ApprovalStatus,
    ChannelKind,
    DeliveryPurpose,
    DeliveryStatus,
    JobPriority,
    JobStatus,
    NodeState,
    PreviousAttempt,
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
    (handoff_tables.Job, "status", JobStatus),
    (handoff_tables.Job, "priority", JobPriority),
    (handoff_tables.JobEvent, "from_status", JobStatus),
    (handoff_tables.JobEvent, "to_status", JobStatus),
    (models.AlertChannel, "kind", ChannelKind),
    (models.Delivery, "purpose", DeliveryPurpose),
    (models.Delivery, "status", DeliveryStatus),
    (models.Run, "previous_attempt", PreviousAttempt),
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


def test_a_stored_word_reads_back_as_its_member_and_an_unknown_one_as_its_string() -> None:
    column = models.Words(RunStatus, 24)
    read = column.process_result_value("failed", sqlite.dialect())
    assert read is RunStatus.FAILED
    # A word a newer node wrote is shown as it is, not refused.
    assert column.process_result_value("paused_forever", None) == "paused_forever"
    assert column.process_bind_param(RunStatus.QUEUED, None) == "queued"
    assert type(column.process_bind_param(RunStatus.QUEUED, None)) is str


def test_an_answer_keeps_an_unknown_word_and_an_argument_refuses_it() -> None:
    answer = TypeAdapter(RunStatusWord)
    assert answer.validate_python("queued") is RunStatus.QUEUED
    assert answer.validate_python("paused_forever") == "paused_forever"
    with pytest.raises(ValidationError):
        TypeAdapter(Annotated[RunStatus, OneOf(RunStatus, strict=True)]).validate_python("x")


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


def _subclasses(cls: type[errors.FloomError]) -> set[type[errors.FloomError]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def test_every_error_an_attempt_ends_with_has_a_run_error_code() -> None:
    # errors.run_error_code takes the error's own code: an attempt ends with the errors of
    # the model provider, the sandbox and the state (floom/engine/attempt.py, floom/agent/).
    import floom.agent
    import floom.sandbox

    for package in (floom.sandbox, floom.agent):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    ending = (
        _subclasses(errors.ProviderError)
        | _subclasses(SandboxUnavailable)
        | {errors.StateInvalid, errors.StateTooLarge, errors.SourceUnavailable}
    )
    assert len(ending) > 8
    for cls in ending:
        assert errors.run_error_code(cls()) == cls.code, cls


def test_each_surface_that_styles_a_word_styles_every_word_of_its_set() -> None:
    assert set(STATUS_STYLES) == set(RunStatus)
    assert set(APPROVAL_STYLES) == set(ApprovalStatus)
    assert set(TOOL_STYLES) == set(ToolCallStatus)


# -- no bare words: floom names a closed set's word by its enum ---------------------------------

FLOOM = Path(__file__).resolve().parents[2] / "floom"
# The fields that hold a word of a closed set, wherever floom names them: attributes, names,
# keyword arguments, a body's keys ("status": ...), a mapping's `["status"]` or `.get("status")`.
FIELDS: dict[str, set[str]] = {
    "status": {*RunStatus, *ApprovalStatus, *ToolCallStatus, *JobStatus, *DeliveryStatus},
    "run_status": set(RunStatus),
    "from_status": set(JobStatus),
    "to_status": set(JobStatus),
    "priority": set(JobPriority),
    "trigger": set(RunTrigger),
    "kind": {*ApprovalKind, *TriggerKind, *ChannelKind},
    "purpose": set(DeliveryPurpose),
    "previous_attempt": set(PreviousAttempt),
    "state": set(NodeState),
    "error_code": set(RunErrorCode),
}
# Modules with closed sets of their own that share some words (none left: each set is an enum).
OTHER_VOCABULARIES: tuple[str, ...] = ()
# The health answer's own word.
ALLOWED = {("api/app.py", "ok")}


def _field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "col":
        return _field(node.args[0])  # sqlmodel's col(Run.status)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return str(node.args[0].value)
    return None


def _words(node: ast.AST | None) -> list[ast.Constant]:
    elements = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [e for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _pairs(tree: ast.AST) -> list[tuple[str | None, ast.AST | None]]:
    """(field, value) for each comparison, assignment, keyword and body key."""
    pairs: list[tuple[str | None, ast.AST | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            pairs += [(_field(a), b) for a in sides for b in sides if a is not b]
        elif isinstance(node, ast.Assign):
            pairs += [(_field(t), node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign):
            pairs.append((_field(node.target), node.value))
        elif isinstance(node, ast.keyword):
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Dict):
            pairs += [
                (str(k.value), v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            ]
    return pairs


def bare_words(root: Path) -> list[str]:
    """Where code under `root` compares, assigns or passes a closed set's word as a bare
    string to a field that holds one."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where.startswith(OTHER_VOCABULARIES) or where == "vocabulary.py":
            continue
        for field, value in _pairs(ast.parse(path.read_text())):
            for word in _words(value):
                known = field in FIELDS and word.value in FIELDS[field]
                if known and (where, word.value) not in ALLOWED:
                    found.append(f"floom/{where}:{word.lineno}: {field} {word.value!r}")
    return sorted(set(found))


def test_floom_names_a_closed_sets_word_by_its_enum_never_as_a_bare_string() -> None:
    assert bare_words(FLOOM) == [], "use the enum of floom/vocabulary.py (or RunErrorCode)"


def test_the_bare_word_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "if run.status == 'succeeded':\n"
        "    call = ToolCall(status='ok', kind=k)\n"
        "body = {'trigger': 'manual', 'error_code': 'nope'}\n"
        "if row['kind'] in ('run', 'other'):\n"
        "    pass\n"
    )
    assert bare_words(tmp_path) == [
        "floom/mod.py:1: status 'succeeded'",
        "floom/mod.py:2: status 'ok'",
        "floom/mod.py:3: trigger 'manual'",
        "floom/mod.py:4: kind 'run'",
    ]
