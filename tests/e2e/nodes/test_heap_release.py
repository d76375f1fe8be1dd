"""A server keeps its C heap compact (engine/loops/heap.py): on glibc a release makes freed memory
leave the resident set and every node's presence loop calls it every RELEASE_SECONDS; a
starting app limits the malloc arenas before its threads start, and limited threads share
them; where the C library has no such calls these do nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from floom import node as node_module
from floom.engine.loops import presence
from floom.engine.loops.presence import NodePresence
from floom.services.context import Context
from tests.support.harness import start_server, wait_until

# 2,000 blocks of 16 KiB (under glibc's mmap threshold, so from the heap), every other one
# freed: 16 MiB of free chunks between live ones, which glibc does not give back by itself.
FRAGMENTED_HEAP = """
import ctypes, sys
from floom.engine.loops.heap import release_free_memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]


def rss_kib():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0])


blocks = [libc.malloc(16384) for _ in range(2000)]
for block in blocks:
    ctypes.memset(block, 1, 16384)
for block in blocks[::2]:
    libc.free(block)
before = rss_kib()
released = release_free_memory()
print(released, before - rss_kib())
"""

NOT_GLIBC = """
import ctypes


class NoTrim:
    def __init__(self, name):
        pass

    def __getattr__(self, name):
        raise AttributeError(name)


ctypes.CDLL = NoTrim
from floom.engine.loops.heap import limit_arenas, release_free_memory

print(release_free_memory(), release_free_memory(), limit_arenas())
"""


def _glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_a_release_gives_freed_heap_memory_back_to_the_system() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    released, freed_kib = done.stdout.split()
    assert released == "True"
    assert int(freed_kib) >= 8 * 1024, done.stdout  # of the 16 MiB freed


def test_without_glibc_s_calls_a_release_and_the_arena_limit_do_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NOT_GLIBC], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]


def test_the_presence_loop_releases_free_memory_every_release_seconds_not_every_beat(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []
    monkeypatch.setattr(presence, "RELEASE_SECONDS", 0.5)
    monkeypatch.setattr(presence, "release_free_memory", lambda: calls.append(time.monotonic()))
    assert ctx.settings.heartbeat_seconds < presence.RELEASE_SECONDS
    node = NodePresence(ctx, slots=None, in_use=lambda: 0)
    started = time.monotonic()
    node.start()
    try:
        wait_until(lambda: len(calls) >= 3)
    finally:
        node.stop()
    assert len(calls) <= (calls[-1] - started) / presence.RELEASE_SECONDS + 1, calls


# Eight threads alive at once, each allocating: glibc gives each an arena of its own (up to
# eight per core) unless the arenas are limited. A thread arena is a 64 MiB reservation.
THREAD_ARENAS = """
import sys, threading
from floom.engine.loops.heap import limit_arenas

if sys.argv[1] == "limited":
    assert limit_arenas()
started, done = threading.Barrier(9), threading.Event()


def allocate():
    blocks = [bytearray(4096) for _ in range(64)]
    started.wait()
    done.wait()


threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
started.wait()
reserved = 0
for line in open("/proc/self/maps"):
    span, perms = line.split()[:2]
    start, end = (int(x, 16) for x in span.split("-"))
    if perms == "---p" and len(line.split()) == 5 and (end - start) >= 32 * 2**20:
        reserved += 1
done.set()
for t in threads:
    t.join()
print(reserved)
"""


@pytest.mark.skipif(not _glibc(), reason="M_ARENA_MAX is glibc's")
def test_a_server_s_threads_share_two_malloc_arenas_once_limited() -> None:
    counts = {}
    for mode in ("limited", "unlimited"):
        done = subprocess.run(
            [sys.executable, "-c", THREAD_ARENAS, mode], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        counts[mode] = int(done.stdout)
    assert counts["limited"] <= 1, counts  # the main arena and at most one more
    assert counts["unlimited"] >= 2, counts  # what the limit prevents


def test_a_starting_app_limits_the_malloc_arenas_before_its_threads_start(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    monkeypatch.setattr(node_module, "limit_arenas", lambda: seen.append(threading.active_count()))
    before = threading.active_count()
    server, thread, _ = start_server(ctx)
    try:
        assert seen
        assert seen[0] <= before + 1
    finally:
        server.should_exit = True
        thread.join(timeout=30)
