"""An ended run's log as one blob: its events as JSON lines, gzip-compressed, in seq order.

An agent run's blob also holds its record, moved out of the database with the log: the
transcript's system prompt, messages and state, and its tool calls (services/ops/objects.py
moves them; services/runs/agent.py reads them back). It is the blob's first line, a JSON
object (`{"agent": {...}}`), where every event is a JSON array.

Decoded logs are kept in a small cache by digest (a blob's bytes never change), so a person
paging through a long log, or several followers of one run, read its object once.
"""

from __future__ import annotations

import gzip
import io
import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from floom.errors import BlobUnreadable
from floom.store.blobs.base import unreadable
from floom.store.models import RunEvent, trusted_row

# Decoded logs kept, and the most lines they may hold together.
_CACHED_LOGS = 16
_CACHED_LINES = 200_000
# Fast enough to keep up with a run's end, and about 90% of the best ratio on log text.
_LEVEL = 6
# The most a log blob is unpacked to: this, or _MAX_RATIO times its packed size if more (a
# run's log is up to FLOOM_MAX_LOG_BYTES_PER_RUN an attempt; log text packs about 5 to 20
# times, a gzip bomb about 1000).
MAX_LOG_BLOB_BYTES = 64 << 20
_MAX_RATIO = 64

AgentRecord = dict[str, Any]
# A tool call's columns as its record keeps them (with created_at, as ISO 8601).
CALL_FIELDS = (
    "id",
    "seq",
    "attempt",
    "tool",
    "status",
    "arguments_json",
    "result",
    "result_size",
    "error",
    "duration_ms",
    "approval_id",
)


def call_values(run_id: str, kept: dict[str, Any]) -> dict[str, Any]:
    """A tool call of run `run_id` as a record keeps it, as its row's values."""
    values: dict[str, Any] = {f: kept.get(f) for f in CALL_FIELDS}
    values.update(run_id=run_id, created_at=datetime.fromisoformat(kept["created_at"]))
    return values


def encode_log(events: Sequence[RunEvent], record: AgentRecord | None = None) -> bytes:
    """The events (of one run, in seq order), after the agent run's `record` if it has one,
    as the log blob's bytes. mtime 0: the same events give the same bytes, so the digest is
    stable."""
    head = (
        json.dumps({"agent": record}, ensure_ascii=False, separators=(",", ":")) + "\n"
        if record is not None
        else ""
    )
    text = head + "".join(
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
    return _decoded(run_id, digest, data)[0]


def decode_record(run_id: str, digest: str, data: bytes) -> AgentRecord | None:
    """The agent record a log blob holds (None: it holds none), cached by digest."""
    return _decoded(run_id, digest, data)[1]


def _decoded(run_id: str, digest: str, data: bytes) -> tuple[list[RunEvent], AgentRecord | None]:
    with _lock:
        found = _cache.get(digest)
        if found is not None:
            _cache.move_to_end(digest)
            return found
    events: list[RunEvent] = []
    record: AgentRecord | None = None
    # Its sha256 matching says only that the bytes are the row's, not that floom wrote them
    # (a row of a restored or copied store): anything else than a log floom writes is
    # BlobUnreadable naming the run, and no more is unpacked than a log can be.
    limit = max(MAX_LOG_BLOB_BYTES, _MAX_RATIO * len(data))
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacking:
            raw = unpacking.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise _not_a_log(run_id, digest, f"not gzip ({exc})") from None
    if len(raw) > limit:
        raise _not_a_log(run_id, digest, f"it unpacks to more than {limit} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise _not_a_log(run_id, digest, "not UTF-8 text") from None
    # split("\n"), not splitlines(): JSON escapes newlines but not U+2028 and kin.
    for number, piece in enumerate(text.split("\n"), start=1):
        if not piece:
            continue
        try:
            value = json.loads(piece)
        except (ValueError, RecursionError):
            raise _not_a_log(run_id, digest, f"line {number} is not JSON") from None
        if isinstance(value, dict) and isinstance(value.get("agent", {}), dict):
            record = value.get("agent")
            continue
        event = _event(run_id, value)
        if event is None:
            raise _not_a_log(run_id, digest, f"line {number} is not a log line")
        events.append(event)
    with _lock:
        _cache[digest] = (events, record)
        while len(_cache) > _CACHED_LOGS or (
            len(_cache) > 1 and sum(len(v[0]) for v in _cache.values()) > _CACHED_LINES
        ):
            _cache.popitem(last=False)
    return events, record


def _event(run_id: str, value: Any) -> RunEvent | None:
    """A log line as [seq, attempt, ts, stream, line], as a RunEvent; None when it is not."""
    if not (isinstance(value, list) and len(value) == 5):
        return None
    seq, attempt, ts, stream, line = value
    if not (
        all(isinstance(n, int) and not isinstance(n, bool) for n in (seq, attempt))
        and all(isinstance(t, str) for t in (ts, stream, line))
    ):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return trusted_row(
        RunEvent,
        {
            "run_id": run_id,
            "seq": seq,
            "attempt": attempt,
            "ts": when,
            "stream": stream,
            "line": line,
        },
    )


def _not_a_log(run_id: str, digest: str, why: str) -> BlobUnreadable:
    return unreadable(
        f"the log of run {run_id} is damaged: blob {digest} is not a log floom wrote ({why})"
    )


def cached_log(digest: str) -> list[RunEvent] | None:
    """The decoded log of `digest` when it is cached, else None (no store is asked)."""
    with _lock:
        found = _cache.get(digest)
        return found[0] if found is not None else None


_lock = threading.Lock()
_cache: OrderedDict[str, tuple[list[RunEvent], AgentRecord | None]] = OrderedDict()
