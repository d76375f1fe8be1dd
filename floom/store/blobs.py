"""Content-addressed bytes (version archives, artifacts), stored once per digest."""

from __future__ import annotations

import hashlib

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session

from floom.store.models import Blob, utcnow


def insert_blob(s: Session, data: bytes, *, digest: str | None = None) -> str:
    """Store `data` under `digest` (its sha256 unless given) once, even when a concurrent
    transaction stores the same bytes: a plain get-then-add collides on PostgreSQL."""
    digest = digest or hashlib.sha256(data).hexdigest()
    if s.get(Blob, digest) is not None:
        return digest
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    row = {"digest": digest, "size": len(data), "data": data, "created_at": utcnow()}
    s.execute(insert(Blob).values(**row).on_conflict_do_nothing(index_elements=["digest"]))
    return digest
