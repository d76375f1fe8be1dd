"""A server hands the C heap's free pages back to the system (engine/heap.py): on glibc the
release makes freed memory leave the resident set, elsewhere it is a no-op, and every
node's presence loop calls it every RELEASE_SECONDS."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from floom.engine import presence
from floom.engine.presence import NodePresence
from floom.services.context import Context
from tests.conftest import wait_until

# 2,000 blocks of 16 KiB (under glibc's mmap threshold, so from the heap), every other one
# freed: 16 MiB of free chunks between live ones, which glibc does not give back by itself.
FRAGMENTED_HEAP = """
import ctypes, sys
from floom.engine.heap import release_free_memory

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
from floom.engine.heap import release_free_memory

print(release_free_memory(), release_free_memory())
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


def test_without_glibc_s_malloc_trim_a_release_does_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NOT_GLIBC], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


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
