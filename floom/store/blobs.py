"""Content-addressed bytes (version archives, artifacts), stored once per digest."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, delete
from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from floom.store.agents import Transcript
from floom.store.db import Writer, on_postgres
from floom.store.models import Artifact, Blob, Version, utcnow

# Digests per statement when asking which blobs are still referred to.
_CHUNK = 500


def insert_blob(s: Writer, data: bytes, *, digest: str | None = None) -> str:
    """Store `data` under `digest` (its sha256 unless given) once, even when a concurrent
    transaction stores the same bytes: a plain get-then-add collides on PostgreSQL."""
    digest = digest or hashlib.sha256(data).hexdigest()
    postgres = on_postgres(s)
    stored, insert_new = _blob_statements(postgres)
    if s.execute(stored, {"digest": digest}).first() is not None:
        return digest  # stored already (its bytes are not read back to find out)
    s.execute(
        insert_new, {"digest": digest, "size": len(data), "data": data, "created_at": utcnow()}
    )
    return digest


@lru_cache(maxsize=2)
def _blob_statements(postgres: bool) -> tuple[Any, Any]:
    """Whether a digest is stored, and the INSERT that skips a digest stored meanwhile: Core
    statements built once per dialect (building one costs more than running it, and an ORM
    statement takes the ORM's longer path for rows floom never reads back as objects).

    The dialect's own INSERT, imported here: SQLAlchemy's PostgreSQL dialect costs a node on
    SQLite about 2 MiB resident (and the SQLite one is loaded there anyway)."""
    blobs = Blob.__table__  # type: ignore[attr-defined]
    if postgres:
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    stored = core_select(blobs.c.digest).where(blobs.c.digest == bindparam("digest"))
    insert_new = insert(blobs).on_conflict_do_nothing(index_elements=["digest"])
    return stored, insert_new


def delete_unreferenced_blobs(s: Session, digests: Iterable[str]) -> int:
    """Delete those of `digests` that no version, artifact or agent workspace refers to any
    more (blobs are content-addressed and shared); returns how many went."""
    ordered = sorted(set(digests))
    deleted = 0
    for i in range(0, len(ordered), _CHUNK):
        chunk = ordered[i : i + _CHUNK]
        referenced: set[str] = set()
        for column in (Version.digest, Artifact.digest, Transcript.workspace_digest):
            referenced.update(
                d for d in s.exec(select(column).where(col(column).in_(chunk))).all() if d
            )
        gone = [d for d in chunk if d not in referenced]
        if gone:
            s.execute(delete(Blob).where(col(Blob.digest).in_(gone)))
            deleted += len(gone)
    return deleted
