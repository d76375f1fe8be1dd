"""The session's guard against leaked processes (tests/conftest.py, tests/support/children.py):
a child still running, or ended but never waited for, fails it; one waited for does not."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support.children import children, fail_if_children_left


def test_a_child_still_running_fails_the_guard_and_one_waited_for_does_not() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10  # until the forked child has exec'd sleep
        while not children().get(proc.pid, "").startswith("S sleep 30"):
            assert time.monotonic() < deadline, children()
            time.sleep(0.02)
        with pytest.raises(pytest.fail.Exception, match=f"{proc.pid}: S sleep 30"):
            fail_if_children_left(grace=0.2)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.pid not in children()


def test_a_child_ended_but_never_waited_for_fails_the_guard() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    proc.kill()
    try:
        deadline = time.monotonic() + 10
        while not children().get(proc.pid, "").startswith("Z"):
            assert time.monotonic() < deadline, children()
            time.sleep(0.05)
        with pytest.raises(pytest.fail.Exception, match=f"{proc.pid}: Z"):
            fail_if_children_left(grace=0.2)
    finally:
        proc.wait(timeout=10)
    assert proc.pid not in children()
