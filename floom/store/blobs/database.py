"""The default blob store: the bytes are the blobs row's own `data`, in floom's database.

New blobs reach it inline (rows.insert_blob writes the bytes in the caller's transaction);
`put` serves moving a blob back from a bucket (`floom blobs migrate --to database`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sqlalchemy import delete, update
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from floom.store.blobs.base import BlobStore, Finding, missing, of_size, verified
from floom.store.db import session_scope
from floom.store.models import Blob


class DatabaseBlobStore(BlobStore):
    name: ClassVar[str] = "database"
    inline: ClassVar[bool] = True

    def __init__(self, engine: Engine, *, max_unsized_bytes: int = 64 * 1024 * 1024) -> None:
        self.engine = engine
        # The most a version's archive without a sha256 is unpacked to, to check its digest.
        self.max_unsized_bytes = max_unsized_bytes

    def put(self, digest: str, data: bytes, *, sha256: str) -> None:
        with session_scope(self.engine, write=True) as s:
            if s.get(Blob, digest) is None:
                s.add(Blob(digest=digest, size=len(data), data=data, sha256=sha256))
                return
            s.execute(
                update(Blob)
                .where(col(Blob.digest) == digest)
                .values(data=data, size=len(data), sha256=sha256, location=self.name)
            )

    def get(self, digest: str, *, sha256: str | None, what: str, size: int | None) -> bytes:
        with session_scope(self.engine) as s:
            data = s.exec(
                select(Blob.data).where(Blob.digest == digest, Blob.location == self.name)
            ).first()
        if data is None:
            raise missing(what=what, where=self.describe(digest))
        of_size(len(data), size=size, what=what, where=self.describe(digest))
        return verified(
            data,
            digest=digest,
            sha256=sha256,
            max_bytes=self.max_unsized_bytes,
            what=what,
            where=self.describe(digest),
        )

    def delete(self, digests: Sequence[str]) -> None:
        if not digests:
            return
        with session_scope(self.engine, write=True) as s:
            s.execute(
                delete(Blob).where(
                    col(Blob.digest).in_(list(digests)), col(Blob.location) == self.name
                )
            )

    def describe(self, digest: str) -> str:
        return f"blob {digest} in the database"

    def check(self) -> list[Finding]:
        return [
            Finding(
                "blob store",
                "ok",
                "the database (FLOOM_BLOB_STORE=database): archives, artifacts and logs are "
                "rows of floom's database",
            )
        ]
