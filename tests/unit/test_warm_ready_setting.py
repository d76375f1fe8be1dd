"""FLOOM_WARM_READY: unset, each pool may keep one child more than the executor's slots (at
least 4), so a burst on a node with many slots finds every run a child; set, it is kept."""

from __future__ import annotations

import pytest

from floom.config import Settings
from floom.sandbox import LocalSandbox, get_sandbox


@pytest.mark.parametrize(
    ("slots", "ready", "expected"),
    [(8, None, 9), (2, None, 4), (4, None, 5), (200, None, 64), (8, 3, 3), (1, 12, 12)],
)
def test_the_warm_pools_keep_one_child_more_than_the_slots_unless_told(
    slots: int, ready: int | None, expected: int
) -> None:
    settings = Settings(executor_slots=slots, warm_ready=ready, sandbox_uid_count=1024)
    local = get_sandbox("local", settings)
    try:
        assert isinstance(local, LocalSandbox)
        if local.warm is None:
            pytest.skip("warm starts need a root floom")
        assert local.warm.settings.ready == expected
    finally:
        local.close()
