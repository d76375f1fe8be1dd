"""Handing the C heap's free pages back to the system, where the C library can (glibc's
malloc_trim); a no-op elsewhere (musl, macOS), whose allocators return memory themselves
or offer no such call.

A server's threads (the event loop, the run threads, the API's worker threads) each
allocate from glibc's per-thread arenas; memory freed after a run stays resident in them
as free chunks scattered between live ones, which glibc returns to the system only from
the top of the main heap. Over 4,000 runs of bench/bench_soak.py that free memory grew from
7 to 14 MiB (glibc's mallinfo2), most of the server's RSS growth. malloc_trim(0) gives
every free page of every arena back (madvise), leaving the chunks in place: a few
milliseconds for a heap this size, with the GIL released (ctypes), so a background loop
calls it now and then (engine/presence.py) rather than any request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked_up = False
_lookup = threading.Lock()


def _find_trim() -> Callable[[int], int] | None:
    # Imported here, not at the top: ctypes (about 0.2 MiB) only once a server has run a
    # while, in the background thread that releases.
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc: no such call
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system; False where that cannot be done
    (not glibc), True otherwise."""
    global _trim, _looked_up
    if not _looked_up:
        with _lookup:
            if not _looked_up:
                _trim = _find_trim()
                _looked_up = True
    if _trim is None:
        return False
    _trim(0)
    return True
