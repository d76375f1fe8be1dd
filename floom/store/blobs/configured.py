"""The blob stores a node uses: the one new blobs go to (FLOOM_BLOB_STORE), and the one
holding the blobs recorded at each location."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from floom.errors import BlobStoreUnavailable
from floom.store.blobs.base import RETRY_AFTER_SECONDS, BlobStore, largest_blob_bytes
from floom.store.blobs.database import DatabaseBlobStore
from floom.store.blobs.s3 import S3BlobStore

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from floom.config import Settings


def new_blob_store(settings: Settings, engine: Engine) -> BlobStore:
    """Where this node puts new blobs."""
    return store_at(settings.blob_store, settings, engine)


def store_at(location: str, settings: Settings, engine: Engine) -> BlobStore:
    """The store holding the blobs whose row says `location`."""
    if location == DatabaseBlobStore.name:
        return DatabaseBlobStore(engine, max_unsized_bytes=largest_blob_bytes(settings))
    if not settings.s3_bucket:
        raise BlobStoreUnavailable(
            "this blob is kept in object storage, and this node has no bucket configured",
            hint="set FLOOM_S3_BUCKET, FLOOM_S3_ENDPOINT and the S3 credentials on every "
            "node as on the one that stored it (README: Object storage)",
            details={"retry_after_seconds": RETRY_AFTER_SECONDS},
        )
    return s3_store(settings)


def s3_store(settings: Settings) -> S3BlobStore:
    """The node's bucket store, one per configuration: its boto3 client is made once and
    shared by threads."""
    key = (
        settings.s3_bucket,
        settings.s3_prefix,
        settings.s3_endpoint,
        settings.s3_region,
        settings.s3_access_key_id,
        settings.s3_secret_access_key,
        settings.s3_credentials_file,
        settings.s3_timeout_seconds,
    )
    with _lock:
        store = _s3_stores.get(key)
        if store is None:
            store = _s3_stores[key] = S3BlobStore.from_settings(settings)
        return store


_lock = threading.Lock()
_s3_stores: dict[tuple[object, ...], S3BlobStore] = {}
