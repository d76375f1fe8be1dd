"""The thread that releases what runs held (floom/sandbox/releases.py), on its own: order,
paths held until released, drains, and a release that fails."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

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


def test_a_release_that_fails_is_logged_and_one_that_raises_system_exit_keeps_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    releases = Releases(delay=0)
    done: list[str] = []

    def fail() -> None:
        raise OSError("device busy")

    def exit_thread() -> None:
        raise SystemExit(3)  # would end a thread that caught Exception only

    with caplog.at_level(logging.ERROR, logger="floom.sandbox"):
        releases.add(fail)
        releases.add(exit_thread)
        releases.add(lambda: done.append("after both"))
        assert releases.drain(timeout=10)
    assert done == ["after both"]
    failures = [r for r in caplog.records if r.getMessage() == "releasing what a run held failed"]
    assert len(failures) == 2
    assert failures[0].exc_info is not None
    assert "device busy" in str(failures[0].exc_info[1])
    assert releases.pending() == 0


def test_past_its_room_a_release_runs_at_once_on_the_caller_s_thread() -> None:
    # Back-pressure: a thread that falls behind does not pile up what runs held.
    releases = Releases(room=2, delay=60)  # nothing runs on the thread until waited for
    ran: list[tuple[str, str]] = []

    def record(name: str) -> Callable[[], None]:
        return lambda: ran.append((name, threading.current_thread().name))

    assert releases.add(record("first")) is True
    assert releases.add(record("second")) is True
    assert releases.add(record("third")) is False
    assert ran == [("third", threading.current_thread().name)]
    assert releases.pending() == 2
    assert releases.drain(timeout=10)
    assert [name for name, _ in ran] == ["third", "first", "second"]
    assert {thread for name, thread in ran[1:]} == {"floom-releases"}


def test_a_release_not_to_be_left_for_later_runs_at_once() -> None:
    releases = Releases(delay=60)
    ran: list[str] = []
    assert releases.add(lambda: ran.append("now"), later=False) is False
    assert ran == ["now"]
    assert releases.pending() == 0


def test_an_idle_thread_ends_and_the_next_release_starts_another() -> None:
    releases = Releases(delay=0, idle=0.01)
    threads: list[threading.Thread] = []
    releases.add(lambda: threads.append(threading.current_thread()))
    assert releases.drain(timeout=10)
    threads[0].join(10)
    assert not threads[0].is_alive()
    releases.add(lambda: threads.append(threading.current_thread()))
    assert releases.drain(timeout=10)
    assert threads[1] is not threads[0]
