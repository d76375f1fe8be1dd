"""The thread that releases what runs held (floom/sandbox/releases.py), on its own: order,
paths held until released, drains, and a release that fails."""

from __future__ import annotations

import threading
from pathlib import Path

from floom.sandbox.releases import Releases


def test_releases_run_in_the_order_they_were_added() -> None:
    releases = Releases(delay=0)
    done: list[int] = []
    for number in range(5):
        releases.add(lambda number=number: done.append(number))  # type: ignore[misc]
    assert releases.drain(timeout=10)
    assert done == [0, 1, 2, 3, 4]


def test_a_drain_waits_for_the_releases_added_before_it_and_not_for_later_ones() -> None:
    # A node's runs keep adding releases while one run waits for a uid: that wait ends once
    # the releases before it are done, however many came after.
    releases = Releases(delay=60)  # none runs until someone waits for it
    later = threading.Event()
    releases.add(lambda: releases.add(lambda: later.wait(10)))
    try:
        assert releases.drain(timeout=10)
        assert releases.pending() == 1  # the later one, still waiting
    finally:
        later.set()
    assert releases.drain(timeout=10)
    assert releases.pending() == 0


def test_a_path_is_free_once_its_release_is_done(tmp_path: Path) -> None:
    releases = Releases(delay=60)
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    releases.add(run_dir.rmdir, path=run_dir)
    assert run_dir.exists()
    # Waiting for the path runs its release now, not after the delay.
    assert releases.wait_for(run_dir, timeout=10)
    assert not run_dir.exists()


def test_a_release_that_fails_does_not_stop_the_next_ones() -> None:
    releases = Releases(delay=0)
    done: list[str] = []

    def fail() -> None:
        raise OSError("busy")

    releases.add(fail)
    releases.add(lambda: done.append("next"))
    assert releases.drain(timeout=10)
    assert done == ["next"]
    assert releases.pending() == 0
