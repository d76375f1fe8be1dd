"""An ended run's log as one blob: its events as JSON lines, gzip-compressed, in seq order.

Decoded logs are kept in a small cache by digest (a blob's bytes never change), so a person
paging through a long log, or several followers of one run, read its object once.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime

from floom.store.models import RunEvent, trusted_row

# Decoded logs kept, and the most lines they may hold together.
_CACHED_LOGS = 16
_CACHED_LINES = 200_000
# Fast enough to keep up with a run's end, and about 90% of the best ratio on log text.
_LEVEL = 6


def encode_log(events: Sequence[RunEvent]) -> bytes:
    """The events (of one run, in seq order) as the log blob's bytes. mtime 0: the same
    events give the same bytes, so the digest is stable."""
    text = "".join(
        json.dumps(
            [e.seq, e.attempt, e.ts.isoformat(), e.stream, e.line],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        + "\n"
        for e in events
    )
    return gzip.compress(text.encode(), compresslevel=_LEVEL, mtime=0)


def decode_log(run_id: str, digest: str, data: bytes) -> list[RunEvent]:
    """The events a log blob holds, as (unsaved) RunEvent rows, cached by digest."""
    with _lock:
        found = _cache.get(digest)
        if found is not None:
            _cache.move_to_end(digest)
            return found
    events = [
        trusted_row(
            RunEvent,
            {
                "run_id": run_id,
                "seq": seq,
                "attempt": attempt,
                "ts": datetime.fromisoformat(ts),
                "stream": stream,
                "line": line,
            },
        )
        for seq, attempt, ts, stream, line in (
            # split("\n"), not splitlines(): JSON escapes newlines but not U+2028 and kin.
            json.loads(text)
            for text in gzip.decompress(data).decode().split("\n")
            if text
        )
    ]
    with _lock:
        _cache[digest] = events
        while len(_cache) > _CACHED_LOGS or (
            len(_cache) > 1 and sum(len(v) for v in _cache.values()) > _CACHED_LINES
        ):
            _cache.popitem(last=False)
    return events


def cached_log(digest: str) -> list[RunEvent] | None:
    """The decoded log of `digest` when it is cached, else None (no store is asked)."""
    with _lock:
        return _cache.get(digest)


_lock = threading.Lock()
_cache: OrderedDict[str, list[RunEvent]] = OrderedDict()
