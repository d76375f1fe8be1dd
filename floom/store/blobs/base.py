"""The blob store seam: where the bytes of floom's blobs live.

The blobs table (floom/store/blobs/rows.py) indexes every blob whatever holds its bytes: its
digest (the key), size, sha256 and `location`, the `name` of the store that holds them. A
store only keeps bytes under digests; which blobs exist, who refers to them and when they go
is the table's business. Two stores: the database itself (database.py, the default: the
bytes are the row's `data`) and an S3-compatible bucket (s3.py).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from floom.bundle import read_archive
from floom.errors import BlobUnreadable, FloomError
from floom.hints import act, told

if TYPE_CHECKING:
    from floom.config import Settings

_RESTORE_HINT = told(
    "restore the object from a backup or the bucket's versioning; ",
    act("blobs check"),
    " lists every damaged or missing blob",
)
# What a client is told to wait before asking again while the object store is away.
RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class Finding:
    """One thing `floom doctor` reports about a store: status "ok", "warn" or "fail"."""

    name: str
    status: str
    detail: str
    fix: str = ""


class BlobStore(ABC):
    """Keeps bytes under digests. Every method may be called from any thread.

    Errors: `BlobStoreUnavailable` (floom/errors.py, 503 with a retry hint) when the store
    cannot be reached or refuses floom's credentials, after the store's own retries; never a
    driver's exception. `BlobUnreadable` when the store answers but holds nothing, or other
    bytes, under a digest.
    """

    #: Recorded as the blobs row's `location` for the blobs this store holds.
    name: ClassVar[str]
    #: Whether the bytes travel in the blobs row itself, written in the caller's transaction
    #: (the database); otherwise `put` makes them durable before that row is committed.
    inline: ClassVar[bool]

    @abstractmethod
    def put(self, digest: str, data: bytes, *, sha256: str) -> None:
        """Make `data` durable under `digest`. Called outside any database transaction of the
        caller (it may take the store's timeout). Idempotent: putting a digest again with the
        same bytes succeeds. Raises BlobStoreUnavailable; then nothing is held under `digest`
        that was not held before."""

    @abstractmethod
    def get(self, digest: str, *, sha256: str | None, what: str, size: int | None) -> bytes:
        """The bytes held under `digest`, checked against `sha256` when given (None: a blob
        stored before floom kept checksums). `what` names the blob for a person ("artifact
        'report.csv' of run r_..."): BlobUnreadable says it and the object when nothing or
        other bytes are held. With `size` (the blobs row's), an object of another size is
        unreadable before its bytes are read, and no more than `size` bytes are ever read:
        whatever a bucket holds, floom reads no more than it stored. Raises
        BlobStoreUnavailable."""

    @abstractmethod
    def delete(self, digests: Sequence[str]) -> None:
        """Drop whatever is held under `digests`; a digest held nowhere is no error, so a
        repeated delete succeeds. Raises BlobStoreUnavailable."""

    @abstractmethod
    def describe(self, digest: str) -> str:
        """Where `digest`'s bytes are, for messages (a row of the blobs table, an object)."""

    @abstractmethod
    def check(self) -> list[Finding]:
        """What `floom doctor` reports: reachable, writable, and advice on its settings. Writes
        and deletes at most one small object of its own; never raises for the store's state."""


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verified(
    data: bytes, *, digest: str, sha256: str | None, max_bytes: int, what: str, where: str
) -> bytes:
    """`data` when it matches `sha256`, or, for a blob stored before floom kept checksums
    (None), when its digest vouches for it (vouched_sha256, reading an archive no further
    than `max_bytes` unpacked); BlobUnreadable otherwise."""
    if sha256 is None:
        vouched_sha256(data, digest=digest, max_bytes=max_bytes, what=what, where=where)
        return data
    if sha256_of(data) != sha256:
        raise BlobUnreadable(
            f"{what} is damaged: {where} does not match its sha256 ({len(data)} bytes read)",
            hint=_RESTORE_HINT,
        )
    return data


def vouched_sha256(data: bytes, *, digest: str, max_bytes: int, what: str, where: str) -> str:
    """The sha256 of `data`, read for a blob that has none recorded (stored before floom kept
    checksums), once its digest vouches for it: an artifact's, a log's or a workspace's digest
    is its bytes' sha256, a version's that of the files its archive holds (floom.bundle; read
    no further than `max_bytes` unpacked). Else BlobUnreadable: the bytes are not the blob's
    (an object replaced in the bucket, a backup's file), and reading, copying or recording
    them would make them pass for it. The one rule of every read of such a blob: `verified`
    (the database's and the bucket's reads), `floom blobs migrate`, `floom backup` and
    `floom restore`."""
    sha = sha256_of(data)
    if sha == digest:
        return sha
    try:
        if read_archive(data, max_bytes=max_bytes).digest == digest:
            return sha
    except FloomError:
        pass  # not a version's archive: nothing vouches for it
    raise BlobUnreadable(
        f"{what} has no sha256 recorded (stored before floom kept checksums), and {where} "
        "does not hold what its digest names",
        hint=_RESTORE_HINT,
    )


def of_size(held: int, *, size: int | None, what: str, where: str) -> None:
    """BlobUnreadable when `held` bytes are not the `size` recorded (None: not known)."""
    if size is not None and held != size:
        raise BlobUnreadable(
            f"{what} is damaged: {where} holds {held} bytes, not the {size} floom stored",
            hint=_RESTORE_HINT,
        )


def largest_blob_bytes(settings: Settings) -> int:
    """A bound on any blob floom stores (its largest: an agent's workspace, up to a bundle
    and an artifact; a run's log), with room for an archive's overhead: what a store reads
    at most of a blob whose row records no size."""
    return (
        settings.max_bundle_bytes
        + settings.max_artifact_bytes
        + settings.max_log_bytes_per_run
        + 1024 * 1024
    )


def over_limit(held: int, *, limit: int, what: str, where: str) -> None:
    """BlobUnreadable when `held` bytes are more than any blob floom stores (`limit`): the
    bytes of a blob whose size was not recorded are read no further."""
    if held > limit:
        raise BlobUnreadable(
            f"{what} is damaged: {where} holds more than {limit} bytes, more than any blob "
            "floom stores (its size was not recorded)",
            hint=_RESTORE_HINT,
        )


def missing(*, what: str, where: str) -> BlobUnreadable:
    return BlobUnreadable(
        f"{what} is missing: {where} does not exist",
        hint=_RESTORE_HINT,
    )


def unreadable(message: str) -> BlobUnreadable:
    """BlobUnreadable saying `message`, with how to restore the blob's bytes."""
    return BlobUnreadable(message, hint=_RESTORE_HINT)
