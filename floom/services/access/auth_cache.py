"""Recently authenticated API keys, so that a request need not query its key each time."""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from floom.store.models import ApiKey

# How long a key stays remembered; a revocation also drops it at once (see `trusted`).
AUTH_CACHE_SECONDS = 10.0
MAX_ENTRIES = 10_000
# On PostgreSQL, how old the node's last proof of hearing every revocation may be for the
# cache to be used: a revocation committed at T is honoured by every node's cache from
# T + HEARD_WITHIN_SECONDS on, however the node was paused or cut off. The signal listener
# proves it once a second (floom/store/signals.py HEARTBEAT_SECONDS), so two heartbeats may
# be late before the node falls back to reading each request's key from the database.
HEARD_WITHIN_SECONDS = 3.0


class AuthCache:
    """Valid keys by hash, for AUTH_CACHE_SECONDS.

    The cache is used only while `trusted`: a revocation on any node must reach it in time.
    On SQLite the one process revokes and forgets, and the cache is always trusted. On
    PostgreSQL the node's signal listener hears every revocation; it proves it is caught up
    by sending itself a heartbeat signal once a second: signals arrive in commit order, so
    when its heartbeat sent at S comes back, every revocation committed before S was heard
    (and forgotten). `heard(S)` then trusts the cache until S + HEARD_WITHIN_SECONDS; past
    that (the node was paused, its connection is frozen or lost) the cache is neither read
    nor filled until a heartbeat comes back. A lost connection clears it at once, and after
    a reconnect nothing is trusted before the first heartbeat on the new connection.
    `epoch` guards the race of a lookup against a revocation: a key read before a
    revocation was heard is not stored after it.

    Privileged writes do not rely on this cache: they read the caller's key again in their
    own transaction (Principal.require_in).
    """

    def __init__(self, *, trusted: bool) -> None:
        # Until when (time.monotonic) the cache may be used: forever on SQLite, until the
        # last heartbeat's bound on PostgreSQL.
        self._trusted_until = math.inf if trusted else -math.inf
        self._items: dict[str, tuple[ApiKey, float]] = {}
        self._epoch = 0
        self._lock = threading.Lock()

    @property
    def trusted(self) -> bool:
        return time.monotonic() < self._trusted_until

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, key_hash: str) -> ApiKey | None:
        now = time.monotonic()
        if now >= self._trusted_until:
            return None
        found = self._items.get(key_hash)
        if found is None or found[1] <= now:
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

    def heard(self, sent_at: float) -> None:
        """Every revocation committed before `sent_at` (time.monotonic) has been heard: the
        listener's heartbeat sent then came back. Trust the cache until the bound."""
        with self._lock:
            until = sent_at + HEARD_WITHIN_SECONDS
            if until > self._trusted_until:
                self._trusted_until = until

    def clear(self, *, trusted: bool | None = None) -> None:
        """Forget every key; `trusted=False` also stops using the cache until `heard` (or
        `trusted=True`, on SQLite)."""
        with self._lock:
            self._epoch += 1
            self._items.clear()
            if trusted is not None:
                self._trusted_until = math.inf if trusted else -math.inf
