"""Ended runs' logs and agent records read back out of their blobs into rows, for the schema
downgrades that drop what records them (migrations 0011 and 0010): the older floom reads
them only as rows. Blobs the database holds are read through the migration's connection;
blobs in object storage from the bucket configured in the environment (FLOOM_S3_*, as on
the nodes). Whatever cannot be read refuses the downgrade before anything is changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from floom.config import Settings
from floom.errors import BlobStoreUnavailable, BlobUnreadable, Conflict
from floom.hints import act, told
from floom.hints.action import Hint
from floom.store.agents import ToolCall
from floom.store.blobs.base import BlobStore, largest_blob_bytes, verified
from floom.store.blobs.configured import s3_store
from floom.store.blobs.logs import call_values, decode_log, decode_record
from floom.store.models import RunEvent

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

_DATABASE = "database"
_TO_DATABASE = told(
    "run ",
    act("blobs migrate", to="database"),
    " with this floom (it moves every blob into the database, checked), then downgrade again",
)


def refused(message: str, *, fix: Hint = _TO_DATABASE) -> Conflict:
    """The downgrade cannot keep every run's record: it changes nothing and says why."""
    return Conflict(
        told("downgrade refused, this step changing nothing: ", message, "; ", *fix.parts),
        hint=fix,
    )


def restore_agent_records(conn: Connection) -> int:
    """Every archived agent transcript gets its text back and its tool calls back as rows,
    from its log's blob (a call still a row is kept); returns how many. Reads every blob
    before writing anything."""
    archived = conn.execute(
        text(
            "SELECT t.run_id, l.digest FROM agent_transcripts t "
            "LEFT JOIN run_logs l ON l.run_id = t.run_id WHERE t.archived "
            "ORDER BY t.run_id"
        )
    ).all()
    records: list[tuple[str, dict[str, Any]]] = []
    for run_id, digest in archived:
        what = f"the transcript of run {run_id}"
        if digest is None:
            raise refused(
                f"{what} was moved into its log's blob, and the run has no row in run_logs",
                fix=told("restore the database from a backup taken with this floom"),
            )
        record = decode_record(run_id, digest, _read(conn, digest, what=what))
        if record is None:
            raise refused(
                f"{what} is missing from the log blob {digest} of run {run_id}",
                fix=told("restore the object from a backup or the bucket's versioning"),
            )
        records.append((run_id, record))
    for run_id, record in records:
        conn.execute(
            text(
                "UPDATE agent_transcripts SET system = :system, messages_json = :messages, "
                "state_json = :state WHERE run_id = :run_id"
            ),
            {
                "system": record["system"],
                "messages": record["messages_json"],
                "state": record["state_json"],
                "run_id": run_id,
            },
        )
        present = set(
            conn.execute(
                text("SELECT id FROM tool_calls WHERE run_id = :run_id"), {"run_id": run_id}
            ).scalars()
        )
        calls = [call_values(run_id, c) for c in record.get("tool_calls", [])]
        calls = [c for c in calls if c["id"] not in present]
        if calls:
            conn.execute(_INSERT_CALL, calls)
    return len(records)


def restore_logs(conn: Connection) -> int:
    """Every ended run's log blob back into run_events (lines still rows are kept); returns
    how many runs'. Refused while any blob is in object storage: the schema before 0010 knows
    only blobs whose bytes are in the database row."""
    elsewhere = conn.execute(
        text("SELECT count(*) FROM blobs WHERE location <> :database"), {"database": _DATABASE}
    ).scalar_one()
    if elsewhere:
        raise refused(
            f"{elsewhere} blob(s) are kept in object storage, and the schema before "
            "revision 0010 reads blobs only from the database"
        )
    archived = conn.execute(text("SELECT run_id, digest FROM run_logs ORDER BY run_id")).all()
    logs = [
        (run_id, decode_log(run_id, digest, _read(conn, digest, what=f"the log of run {run_id}")))
        for run_id, digest in archived
    ]
    for run_id, events in logs:
        present = set(
            conn.execute(
                text("SELECT seq FROM run_events WHERE run_id = :run_id"), {"run_id": run_id}
            ).scalars()
        )
        rows = [
            {
                "run_id": run_id,
                "seq": e.seq,
                "attempt": e.attempt,
                "ts": e.ts,
                "stream": e.stream,
                "line": e.line,
            }
            for e in events
            if e.seq not in present
        ]
        if rows:
            conn.execute(_INSERT_EVENT, rows)
    return len(logs)


def _read(conn: Connection, digest: str, *, what: str) -> bytes:
    row = conn.execute(
        text("SELECT location, sha256, data, size FROM blobs WHERE digest = :digest"),
        {"digest": digest},
    ).first()
    if row is None:
        raise refused(
            f"{what} is missing: blob {digest} has no row in the blobs table",
            fix=told("restore the database from a backup taken with this floom"),
        )
    location, sha256, data, size = row
    try:
        if location == _DATABASE:
            where = f"blob {digest} in the database"
            return verified(
                bytes(data),
                digest=digest,
                sha256=sha256,
                max_bytes=largest_blob_bytes(Settings()),
                what=what,
                where=where,
            )
        return _bucket(location, what=what).get(digest, sha256=sha256, what=what, size=size)
    except (BlobStoreUnavailable, BlobUnreadable) as exc:
        raise refused(f"{exc.message} ({exc.hint})" if exc.hint else exc.message) from exc


def _bucket(location: str, *, what: str) -> BlobStore:
    settings = Settings()
    if not settings.s3_bucket:
        raise BlobStoreUnavailable(
            f"{what} is kept in object storage ({location}), and no bucket is "
            "configured where the downgrade runs (set FLOOM_S3_BUCKET, FLOOM_S3_ENDPOINT and "
            "the S3 credentials as on the nodes)"
        )
    return s3_store(settings)


# The tables as the model declares them (their columns are as at revisions 0009 to 0011):
# Core inserts, so each dialect stores datetimes and statuses as floom does.
_INSERT_CALL = ToolCall.__table__.insert()  # type: ignore[attr-defined]
_INSERT_EVENT = RunEvent.__table__.insert()  # type: ignore[attr-defined]
