"""A run's end wakes the waiters of that run only (services/run_waits.RunEnds): waking every
waiter at every end cost each end one store read per waiter."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from typing import cast

from floom.services.runs.records import RunRecord
from floom.services.runs.waits import DELIVERED_READS, RECENT_ENDS, RunEnds


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


def test_the_thread_that_records_an_end_does_its_waiters_read_and_hands_it_over() -> None:
    # The waiter answers with that read: no trip of its own to a worker thread and back.
    async def scenario() -> tuple[object, bool]:
        ends = RunEnds()
        read_on: list[int] = []

        def reader(record: object) -> str:
            read_on.append(threading.get_ident())
            return "the run as it ended"

        with ends.listening("run_a", reader=reader) as woken:
            ender = threading.Thread(target=ends.notify, args=("run_a",))
            ender.start()
            await woken.wait(5.0)
            ender.join()
            return woken.take(), read_on == [ender.ident]

    found, on_the_ending_thread = asyncio.run(scenario())
    assert found == "the run as it ended"
    assert on_the_ending_thread


def test_the_record_the_end_wrote_is_handed_to_the_waiters_read() -> None:
    # Written and read back in the end's own transaction: the waiter's read needs no store.
    async def scenario() -> list[object]:
        ends = RunEnds()
        given: list[object] = []
        record = cast(RunRecord, object())
        with ends.listening("run_a", reader=given.append) as woken:
            ends.notify("run_a", record)
            await woken.wait(5.0)
        with ends.listening("run_b", reader=given.append) as woken:
            ends.notify("run_b")  # an end recorded without its record (a cancel)
            await woken.wait(5.0)
        return [x is record for x in given[:1]] + given[1:]

    assert asyncio.run(scenario()) == [True, None]


def test_a_read_that_fails_at_the_end_still_wakes_the_waiter_to_read_for_itself() -> None:
    async def scenario() -> tuple[bool, object]:
        ends = RunEnds()

        def reader(record: object) -> str:
            raise RuntimeError("the store went away")

        with ends.listening("run_a", reader=reader) as woken:
            ends.notify("run_a")
            await woken.wait(5.0)
            return woken._event.is_set(), woken.take()

    assert asyncio.run(scenario()) == (True, None)


def _count(reads: list[int], n: int, record: RunRecord | None) -> None:
    reads.append(n)


def test_only_the_first_waiters_of_a_run_get_their_read_done_at_its_end() -> None:
    # A crowd of waiters on one run must not hold the ending executor slot for their reads.
    async def scenario() -> tuple[int, int]:
        ends = RunEnds()
        reads: list[int] = []
        with contextlib.ExitStack() as stack:
            listeners = [
                stack.enter_context(
                    ends.listening("run_a", reader=functools.partial(_count, reads, n))
                )
                for n in range(DELIVERED_READS + 3)
            ]
            ends.notify("run_a")
            await asyncio.sleep(0)
            return len(reads), sum(listener._event.is_set() for listener in listeners)

    reads, woken = asyncio.run(scenario())
    assert reads == DELIVERED_READS
    assert woken == DELIVERED_READS + 3
