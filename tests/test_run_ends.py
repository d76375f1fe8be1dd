"""A run's end wakes the waiters of that run only (services/run_waits.RunEnds): waking every
waiter at every end cost each end one store read per waiter."""

from __future__ import annotations

import asyncio

from floom.services.run_waits import RECENT_ENDS, RunEnds


def test_an_end_wakes_the_waiters_of_its_run_and_no_others() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        ends = RunEnds()
        with ends.listening("run_a") as a, ends.listening("run_b") as b:
            ends.notify("run_b")
            await asyncio.sleep(0)  # the wake-up is scheduled on this loop
            a_after_b = a._event.is_set()
            b_after_b = b._event.is_set()
            ends.notify("run_a")
            await asyncio.sleep(0)
            return a_after_b, b_after_b, a._event.is_set()

    a_after_b, b_after_b, a_after_a = asyncio.run(scenario())
    assert (a_after_b, b_after_b, a_after_a) == (False, True, True)


def test_a_notice_after_the_last_waiter_left_wakes_nobody_and_keeps_nothing() -> None:
    async def scenario() -> None:
        ends = RunEnds()
        with ends.listening("run_a"), ends.listening("run_a"):
            pass
        ends.notify("run_a")
        assert ends._listeners == {}

    asyncio.run(scenario())


def test_a_waiter_that_starts_listening_just_after_the_end_is_woken_at_once() -> None:
    async def scenario() -> tuple[bool, bool]:
        ends = RunEnds()
        # The run ended while its starter's request was on its way back to the event loop.
        ends.notify("run_a")
        with ends.listening("run_a") as late, ends.listening("run_b") as other:
            await asyncio.sleep(0)
            return late._event.is_set(), other._event.is_set()

    assert asyncio.run(scenario()) == (True, False)


def test_only_the_latest_ends_are_remembered() -> None:
    async def scenario() -> bool:
        ends = RunEnds()
        for n in range(RECENT_ENDS + 1):
            ends.notify(f"run_{n}")
        with ends.listening("run_0") as oldest:
            await asyncio.sleep(0)
            return oldest._event.is_set()

    assert asyncio.run(scenario()) is False
