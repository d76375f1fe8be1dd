"""An E2B sandbox's own timeout follows its attempt's lease: created to end at the lease's
deadline, moved on as the lease is renewed, and left where it was when the renewals stop
(floom frozen or cut off), so E2B itself ends it then. Against the E2B stand-in."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.sandbox.base import SandboxResult
from floom.sandbox.fence import lease_clock, node_fence
from tests.standins.e2b import E2BStandin
from tests.support.harness import wait_until
from tests.support.rigs.e2b import e2b_backend, standin_for_module
from tests.support.rigs.sandboxes import run_script


@pytest.fixture(scope="module")
def standin() -> Iterator[E2BStandin]:
    with standin_for_module() as standin:
        yield standin


def _remaining(standin: E2BStandin) -> float | None:
    boxes = list(standin.sandboxes.values())
    return boxes[0].remaining_seconds() if boxes else None


def test_an_e2b_sandbox_s_timeout_follows_its_attempt_s_lease(
    standin: E2BStandin, tmp_path: Path
) -> None:
    e2b = e2b_backend(standin)
    fence = node_fence()
    key = f"run_{secrets.token_hex(8)}.1"
    fence.arm(key, lease_clock() + 8)
    results: list[SandboxResult] = []
    release = threading.Event()

    def run() -> None:
        result, _ = run_script(
            e2b,
            tmp_path,
            "import time\nwhile not __import__('os').path.exists('/tmp/stop'): time.sleep(0.05)",
            should_cancel=release.is_set,
            timeout_seconds=600,
            fence=key,
        )
        results.append(result)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        # Created to end with the lease, not with the run's timeout (600 s and slack).
        first = wait_until(lambda: _remaining(standin))
        assert 5 < first <= 8.5, first
        # A renewal moves it on.
        fence.arm(key, lease_clock() + 40)
        moved = wait_until(lambda: (r := _remaining(standin)) is not None and r > 30 and r)
        assert moved <= 40.5
        # No renewal (floom frozen or cut off): it stays, and E2B ends the sandbox then.
        time.sleep(2.5)
        still = _remaining(standin)
        assert still is not None
        assert still < moved - 2
    finally:
        release.set()
        thread.join(timeout=60)
        fence.forget(key)
    assert results
    assert results[0].cancelled


def test_a_short_lease_renewed_on_time_keeps_its_e2b_sandbox_alive(
    standin: E2BStandin, tmp_path: Path
) -> None:
    # A lease of 3 s renewed every 0.3 s (the deadline 2.7 s ahead, rounded down to 2 s for
    # E2B). The keeper moved E2B's end only once the lease had moved a second past
    # the deadline it last read (not past the end it gave E2B): its first move came at 2 s,
    # racing E2B ending the sandbox then (a warm E2B run failed in CI "while uploading").
    e2b = e2b_backend(standin)
    fence = node_fence()
    key = f"run_{secrets.token_hex(8)}.1"
    fence.arm(key, lease_clock() + 2.7)
    renewing = threading.Event()
    lowest: list[float] = []

    def heartbeat() -> None:
        while not renewing.wait(0.3):
            fence.arm(key, lease_clock() + 2.7)

    def watch() -> None:
        while not renewing.wait(0.02):
            if (left := _remaining(standin)) is not None:
                lowest.append(left)

    beats = threading.Thread(target=heartbeat)
    beats.start()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result, lines = run_script(
            e2b, tmp_path, "import time\ntime.sleep(4.5)\nprint('lived')", fence=key
        )
    finally:
        renewing.set()
        beats.join(timeout=10)
        watcher.join(timeout=10)
        fence.forget(key)
    assert result.exit_code == 0, (result, lines)
    assert ("stdout", "lived") in lines
    # E2B's end never came near: the keeper moves it on well before.
    assert lowest
    assert min(lowest) > 0.6, min(lowest)
