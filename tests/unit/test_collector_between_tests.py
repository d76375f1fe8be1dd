"""The test process's cyclic collector (tests/conftest.py pytest_runtest_teardown): what
earlier tests left is frozen, so a full pass during a test walks only what that test made
and stops the test's threads (a server's heartbeat among them) for that long only."""

from __future__ import annotations

import gc

import pytest

_LEFT_BEHIND: list[list[str]] = []


def test_a_test_leaves_an_object_behind() -> None:
    _LEFT_BEHIND.append(["left by an earlier test"])
    assert gc.is_tracked(_LEFT_BEHIND[0])


def test_what_an_earlier_test_left_is_in_no_generation_a_full_pass_walks() -> None:
    if not _LEFT_BEHIND:
        pytest.skip("run alone: no earlier test of this file left anything")
    left = _LEFT_BEHIND[0]
    gc.collect()  # a full pass now: what it leaves lands in the oldest generation
    walked = any(o is left for generation in range(3) for o in gc.get_objects(generation))
    assert not walked


def test_the_collection_itself_is_out_of_the_passes() -> None:
    # The test modules collected, their functions, the items: made before any test ran.
    assert gc.get_freeze_count() > 10_000
