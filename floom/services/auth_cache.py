"""Recently authenticated API keys, so that a request need not query its key each time."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from floom.store.models import ApiKey

# How long a key stays remembered; a revocation also drops it at once (see `trusted`).
AUTH_CACHE_SECONDS = 10.0
MAX_ENTRIES = 10_000


class AuthCache:
    """Valid keys by hash, for AUTH_CACHE_SECONDS.

    The cache is used only while `trusted`: a revocation on any node must reach it at once.
    On SQLite the one process revokes and forgets; on PostgreSQL the node's signal listener
    sets `trusted` while it is connected (it hears every revocation) and clears the cache
    when it connects and when it loses its connection. `epoch` guards the race of a lookup
    against a revocation: a key read before a revocation was heard is not stored after it.
    """

    def __init__(self, *, trusted: bool) -> None:
        self.trusted = trusted
        self._items: dict[str, tuple[ApiKey, float]] = {}
        self._epoch = 0
        self._lock = threading.Lock()

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, key_hash: str) -> ApiKey | None:
        if not self.trusted:
            return None
        found = self._items.get(key_hash)
        if found is None or found[1] <= time.monotonic():
            return None
        return found[0]

    def put(self, key_hash: str, key: ApiKey, *, epoch: int) -> None:
        """Remember `key`, read from the database when the cache was at `epoch`."""
        with self._lock:
            if not self.trusted or epoch != self._epoch:
                return
            if len(self._items) >= MAX_ENTRIES:
                self._items.clear()
            self._items[key_hash] = (key, time.monotonic() + AUTH_CACHE_SECONDS)

    def forget(self, key_hash: str) -> None:
        with self._lock:
            self._epoch += 1
            self._items.pop(key_hash, None)

    def clear(self, *, trusted: bool | None = None) -> None:
        with self._lock:
            self._epoch += 1
            self._items.clear()
            if trusted is not None:
                self.trusted = trusted
