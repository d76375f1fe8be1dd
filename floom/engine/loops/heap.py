"""Keeping the C heap compact, where the C library allows it (glibc): free pages handed back
to the system (malloc_trim), and a server's threads sharing two malloc arenas instead of
one each (mallopt M_ARENA_MAX); no-ops elsewhere (musl, macOS), whose allocators return
memory themselves or offer no such calls.

A server's threads (the event loop, the run threads, the API's worker threads) each
allocate from glibc's per-thread arenas; memory freed after a run stays resident in them
as free chunks scattered between live ones, which glibc returns to the system only from
the top of the main heap. Over 4,000 runs of bench/bench_soak.py that free memory grew from
7 to 14 MiB (glibc's mallinfo2), most of the server's RSS growth. malloc_trim(0) gives
every free page of every arena back (madvise), leaving the chunks in place: a few
milliseconds for a heap this size, with the GIL released (ctypes), so a background loop
calls it now and then (engine/loops/presence.py) rather than any request.

glibc gives threads that allocate at once arenas of their own, up to eight per core, and a
thread that starts later (the API's worker threads come and go) takes one over; each keeps
its own free chunks, so fifteen arenas hold fifteen sets of them. Python threads allocate
mostly while holding the GIL, one at a time, so they gain little from arenas of their own:
a server limits them to ARENAS before its threads start (floom/node.py). In 4,000-run soaks
side by side the limit left 3.5 MiB less resident and the server's CPU per run the same
(33.6-33.9 ms with and without it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ARENAS = 2
M_ARENA_MAX = -8  # glibc's malloc.h


def _libc_call(name: str) -> Any:
    """A function of the C library loaded into this process, or None where it has none."""
    # Imported here, not at the top: ctypes (about 0.2 MiB) only in a server process.
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), name)  # the symbols already loaded
    except (OSError, AttributeError, TypeError):  # not glibc: no such call
        return None


@functools.cache
def _find_trim() -> Callable[[int], int] | None:
    import ctypes

    trim = _libc_call("malloc_trim")
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def limit_arenas(count: int = ARENAS) -> bool:
    """Let this process's threads share at most `count` malloc arenas from now on; False
    where that cannot be done (not glibc). Arenas made before stay."""
    import ctypes

    mallopt = _libc_call("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system; False where that cannot be done
    (not glibc), True otherwise."""
    trim = _find_trim()
    if trim is None:
        return False
    trim(0)
    return True
