"""The blobs table: one row per content-addressed blob (version archives, artifacts, agent
workspaces, ended runs' logs), stored once per digest, whichever store holds its bytes.

A blob is written in two steps: `stage_blob` outside any transaction (an object store's
upload may take seconds), then `insert_blob` in the caller's transaction. When the object
store cannot take the bytes, they are kept in the row and a pending upload is recorded in
the same transaction: the blob is durable either way, and moved later (services/ops/objects.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, delete
from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from floom.errors import BlobStoreUnavailable
from floom.store.agents import Transcript
from floom.store.blobs.base import largest_blob_bytes, missing, sha256_of, verified
from floom.store.blobs.configured import new_blob_store, store_at
from floom.store.blobs.database import DatabaseBlobStore
from floom.store.blobs.tables import PendingBlob, RunLog
from floom.store.db import Writer, on_postgres, read_connection
from floom.store.models import Artifact, Blob, Version, utcnow
from floom.store.statements import hot

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from floom.config import Settings

log = logging.getLogger("floom.blobs")

# Digests per statement when asking which blobs are still referred to.
_CHUNK = 500
DATABASE = DatabaseBlobStore.name
UPLOAD, DELETE = "upload", "delete"


@dataclass(frozen=True)
class StagedBlob:
    """A blob ready for its row: its bytes are either durable in an object store already
    (`data` empty) or travel in the row (`location` "database"); `pending` when they should
    have gone to the object store, which could not take them."""

    digest: str
    size: int
    sha256: str
    location: str
    data: bytes
    pending: bool = False


def inline_blob(data: bytes, *, digest: str | None = None) -> StagedBlob:
    """`data` as a blob whose bytes the database holds."""
    sha = sha256_of(data)
    return StagedBlob(digest or sha, len(data), sha, DATABASE, data)


def stage_blob(
    settings: Settings, engine: Engine, data: bytes, *, digest: str | None = None
) -> StagedBlob:
    """Make `data` durable where new blobs go (FLOOM_BLOB_STORE); call it outside any
    transaction. The digest is the bytes' sha256 unless given. Never fails for an object
    store that is away: the bytes then travel in the row, as a pending upload."""
    blob = inline_blob(data, digest=digest)
    store = new_blob_store(settings, engine)
    if store.inline:
        return blob
    try:
        store.put(blob.digest, data, sha256=blob.sha256)
    except BlobStoreUnavailable as exc:
        log.warning(
            "blob %s kept in the database until the object store is back: %s",
            blob.digest,
            exc.message,
        )
        return StagedBlob(blob.digest, blob.size, blob.sha256, DATABASE, data, pending=True)
    return StagedBlob(blob.digest, blob.size, blob.sha256, store.name, b"")


def insert_blob(s: Writer, blob: StagedBlob) -> str:
    """Record `blob` once, even when a concurrent transaction records the same digest (a
    plain get-then-add collides on PostgreSQL); returns its digest. A digest recorded
    already keeps its row, wherever its bytes are."""
    postgres = on_postgres(s)
    _, insert_new, insert_pending = _blob_statements(postgres)
    # Asked first only when the row would carry the bytes (they are not sent, nor read back,
    # for a digest stored already); the INSERT skips a digest stored already anyway.
    if blob.data and BLOB_STORED.first(s, {"digest": blob.digest}) is not None:
        return blob.digest
    now = utcnow()
    s.execute(
        insert_new,
        {
            "digest": blob.digest,
            "size": blob.size,
            "data": blob.data,
            "created_at": now,
            "location": blob.location,
            "sha256": blob.sha256,
        },
    )
    if blob.pending:
        s.execute(
            insert_pending,
            {"digest": blob.digest, "action": UPLOAD, "created_at": now, "attempts": 0},
        )
    return blob.digest


@lru_cache(maxsize=2)
def _blob_statements(postgres: bool) -> tuple[Any, Any, Any]:
    """Whether a digest is stored, and the INSERTs that skip a digest stored meanwhile: Core
    statements built once per dialect (building one costs more than running it, and an ORM
    statement takes the ORM's longer path for rows floom never reads back as objects).

    The dialect's own INSERT, imported here: SQLAlchemy's PostgreSQL dialect costs a node on
    SQLite about 2 MiB resident (and the SQLite one is loaded there anyway)."""
    blobs = Blob.__table__  # type: ignore[attr-defined]
    pending = PendingBlob.__table__  # type: ignore[attr-defined]
    if postgres:
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    stored = core_select(blobs.c.digest).where(blobs.c.digest == bindparam("digest"))
    insert_new = insert(blobs).on_conflict_do_nothing(index_elements=["digest"])
    insert_pending = insert(pending).on_conflict_do_nothing(index_elements=["digest"])
    return stored, insert_new, insert_pending


# Whether a digest is stored: the same SELECT on both databases.
BLOB_STORED = hot.Statement("blobs.stored", lambda: _blob_statements(False)[0])


def read_blob(settings: Settings, engine: Engine, digest: str, *, what: str) -> bytes:
    """The bytes of blob `digest`, checked against its sha256, from whichever store holds
    them. `what` names it for a person ("artifact 'a.csv' of run r_..."). Raises
    BlobUnreadable (no such blob, missing or damaged bytes) or BlobStoreUnavailable."""
    blobs = Blob.__table__  # type: ignore[attr-defined]
    with read_connection(engine) as c:
        row = c.execute(
            core_select(blobs.c.location, blobs.c.sha256, blobs.c.data, blobs.c.size).where(
                blobs.c.digest == digest
            )
        ).first()
    return read_blob_row(settings, engine, digest, row, what=what)


def read_blob_row(settings: Settings, engine: Engine, digest: str, row: Any, *, what: str) -> bytes:
    """read_blob with the blob's row (location, sha256, data, size; None: no row) read by
    the caller already, in a query of its own."""
    if row is None or row[0] is None:
        raise missing(what=what, where=f"blob {digest} (no row in the blobs table)")
    location, sha256, data, size = row
    if location == DATABASE:
        return verified(
            bytes(data),
            digest=digest,
            sha256=sha256,
            max_bytes=largest_blob_bytes(settings),
            what=what,
            where=f"blob {digest} in the database",
        )
    return store_at(location, settings, engine).get(digest, sha256=sha256, what=what, size=size)


def delete_unreferenced_blobs(s: Session, digests: Iterable[str]) -> int:
    """Delete those of `digests` that no version, artifact, agent workspace or run log refers
    to any more (blobs are content-addressed and shared); returns how many went. The bytes
    of those an object store holds are recorded as pending deletes in the same transaction,
    for services/ops/objects.py to delete from the store once it is committed."""
    ordered = sorted(set(digests))
    deleted = 0
    for i in range(0, len(ordered), _CHUNK):
        chunk = ordered[i : i + _CHUNK]
        referenced: set[str] = set()
        for column in (
            Version.digest,
            Artifact.digest,
            Transcript.workspace_digest,
            RunLog.digest,
        ):
            referenced.update(
                d for d in s.exec(select(column).where(col(column).in_(chunk))).all() if d
            )
        gone = [d for d in chunk if d not in referenced]
        if not gone:
            continue
        held_elsewhere = list(
            s.exec(
                select(Blob.digest).where(col(Blob.digest).in_(gone), Blob.location != DATABASE)
            ).all()
        )
        s.execute(delete(Blob).where(col(Blob.digest).in_(gone)))
        # A pending upload of a blob that is gone has nothing left to upload.
        s.execute(delete(PendingBlob).where(col(PendingBlob.digest).in_(gone)))
        now = utcnow()
        for digest in held_elsewhere:
            s.add(PendingBlob(digest=digest, action=DELETE, created_at=now))
        deleted += len(gone)
    return deleted
