"""The handoff rules that need no database: the transition table and the condition language."""

from __future__ import annotations

from typing import Any

import pytest

from floom.errors import Forbidden, IllegalTransition, InvalidRequest
from floom.services.handoffs import rules
from floom.services.handoffs.rules import check_transition, evaluate
from floom.vocabulary import JobStatus

RESULT = {
    "summary": "looked at it",
    "data": {"verdict": "approve", "score": 0.9, "tags": ["fast", "safe"], "n": 3},
    "artifacts": [{"type": "file", "uri": "s3://b/x"}],
}


def test_every_status_has_a_row_and_final_statuses_have_no_moves() -> None:
    assert set(rules.TRANSITIONS) == set(rules.STATUSES)
    for status in rules.TERMINAL:
        assert rules.TRANSITIONS[status] == {}
    for moves in rules.TRANSITIONS.values():
        assert set(moves) <= set(rules.STATUSES)


def test_an_illegal_transition_is_refused_with_the_allowed_ones_listed() -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(JobStatus.PUBLISHED, "completed", parties={rules.ASSIGNEE}, admin=True)
    assert info.value.code == "illegal_transition"
    assert info.value.status == 409
    assert info.value.details["allowed"] == ["in_progress", "cancelled"]
    assert "in_progress, cancelled" in (info.value.hint or "")


def test_a_final_status_refuses_every_move_and_points_at_reject() -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(JobStatus.COMPLETED, "in_progress", parties={rules.ASSIGNEE}, admin=True)
    assert info.value.details["allowed"] == []
    assert "reject" in (info.value.hint or "")


def test_only_the_assignee_or_an_admin_may_complete() -> None:
    check_transition(JobStatus.IN_PROGRESS, "completed", parties={rules.ASSIGNEE}, admin=False)
    check_transition(JobStatus.IN_PROGRESS, "completed", parties=set(), admin=True)
    with pytest.raises(Forbidden):
        check_transition(JobStatus.IN_PROGRESS, "completed", parties={rules.SOURCE}, admin=False)


def test_publishing_a_pending_job_is_floom_s_move_alone_even_for_admins() -> None:
    check_transition(JobStatus.PENDING, "published", parties={rules.SYSTEM}, admin=False)
    with pytest.raises(Forbidden) as info:
        check_transition(JobStatus.PENDING, "published", parties={rules.SOURCE}, admin=True)
    assert "floom makes this move itself" in info.value.message


def test_an_unknown_status_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        check_transition(JobStatus.PUBLISHED, "done", parties=set(), admin=True)


def test_allowed_targets_depend_on_the_part_the_caller_plays() -> None:
    assert rules.allowed_targets(JobStatus.IN_PROGRESS, parties={rules.SOURCE}, admin=False) == [
        "cancelled"
    ]
    assert "completed" in rules.allowed_targets(JobStatus.IN_PROGRESS, parties=set(), admin=True)
    assert rules.allowed_targets(JobStatus.PENDING, parties=set(), admin=True) == ["cancelled"]


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (None, True),
        ({"path": "data.verdict", "equals": "approve"}, True),
        ({"path": "data.verdict", "equals": "reject"}, False),
        ({"path": "data.verdict", "not_equals": "reject"}, True),
        ({"path": "data.missing", "not_equals": "x"}, True),
        ({"path": "data.missing", "equals": None}, False),
        ({"path": "data.missing", "exists": False}, True),
        ({"path": "data.score", "gte": 0.9}, True),
        ({"path": "data.score", "lt": 0.5}, False),
        ({"path": "data.verdict", "gt": 1}, False),
        ({"path": "data.tags", "contains": "safe"}, True),
        ({"path": "data.tags.0", "equals": "fast"}, True),
        ({"path": "data.tags.5", "exists": True}, False),
        ({"path": "data.n", "in": [1, 2, 3]}, True),
        ({"path": "artifacts.0.type", "equals": "file"}, True),
        ({"all": [{"path": "data.n", "gt": 2}, {"path": "summary", "exists": True}]}, True),
        ({"any": [{"path": "data.n", "gt": 5}, {"path": "data.verdict", "equals": "x"}]}, False),
        ({"not": {"path": "data.verdict", "equals": "approve"}}, False),
    ],
)
def test_conditions_evaluate_against_the_result(
    condition: dict[str, Any] | None, expected: bool
) -> None:
    if condition is not None:
        rules.check_condition(condition)
    assert evaluate(condition, RESULT) is expected


@pytest.mark.parametrize(
    "condition",
    [
        "data.verdict == 'approve'",
        {"path": "data.verdict"},
        {"path": "data.verdict", "equals": 1, "gt": 2},
        {"path": "data.verdict", "matches": ".*"},
        {"path": "data.n", "in": 3},
        {"path": "data.n", "gt": "3"},
        {"path": "data.n", "exists": "yes"},
        {"all": []},
        {"not": "x"},
        {"path": "", "equals": 1},
    ],
)
def test_malformed_conditions_are_refused_when_the_job_is_published(condition: object) -> None:
    with pytest.raises(InvalidRequest):
        rules.check_routing([{"role": "reviewer", "condition": condition}])


# JSON values of every kind, as a condition compares them and as a result holds them.
VALUES: list[Any] = [None, True, 0, -1, 10**400, 1.5, "", "a", "²", [], [1], ["a"], {}, {"a": 1}]
PATHS = ["data.v", "data.v.0", "data.v.-1", "data.v.²", "data.v." + "9" * 5000, "summary"]


def test_any_validated_condition_answers_for_any_result_and_never_raises() -> None:
    """A condition that raised (`contains` of a list in an object, of a number in a text, a
    list index int() refuses) failed every completion of its job with a 500, and every
    bridge pass after a bridged run of it."""
    for path in PATHS:
        for op in rules.CONDITION_OPS:
            for expected in VALUES:
                cond = {"path": path, op: expected}
                try:
                    rules.check_condition(cond)
                except InvalidRequest:
                    continue  # refused at publishing: never evaluated
                for value in VALUES:
                    result = {"summary": "s", "data": {"v": value}, "artifacts": []}
                    assert evaluate(cond, result) in (True, False), (cond, value)
    assert evaluate({"path": "data.v", "contains": "a"}, {"data": {"v": {"a": 1}}})
    assert evaluate({"path": "data.v", "contains": [1]}, {"data": {"v": [[1], 2]}})
    assert not evaluate({"path": "data.v", "contains": [1]}, {"data": {"v": {"a": 1}}})
    assert not evaluate({"path": "data.v", "contains": 1}, {"data": {"v": "1"}})
    assert evaluate({"path": "data.v.-1", "equals": 2}, {"data": {"v": [1, 2]}})


def test_deeply_nested_conditions_are_refused() -> None:
    cond: dict[str, Any] = {"path": "a", "exists": True}
    for _ in range(rules.MAX_CONDITION_DEPTH + 2):
        cond = {"not": cond}
    with pytest.raises(InvalidRequest):
        rules.check_condition(cond)


def test_artifacts_need_a_type_and_a_uri_and_nothing_unknown() -> None:
    ok = rules.check_artifacts([{"type": "file", "uri": "s3://b/k", "checksum": "sha256:1"}])
    assert ok == [{"type": "file", "uri": "s3://b/k", "checksum": "sha256:1", "metadata": {}}]
    for bad in ([{"type": "file"}], [{"type": "f", "uri": "u", "size": 3}], ["s3://x"]):
        with pytest.raises(InvalidRequest):
            rules.check_artifacts(bad)
