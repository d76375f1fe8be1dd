"""The S3-compatible blob store (AWS S3, SeaweedFS, MinIO, Ceph RGW, R2...): one object per
blob, `<FLOOM_S3_PREFIX>blobs/<digest>`, through boto3 (README: Object storage says why).

boto3 loads (~140 ms, some MiB) only on a node that configures this store.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from floom.errors import BlobStoreUnavailable, BlobUnreadable, FloomError, InvalidRequest
from floom.hints import act, told
from floom.store.blobs.base import (
    RETRY_AFTER_SECONDS,
    BlobStore,
    Finding,
    largest_blob_bytes,
    missing,
    of_size,
    over_limit,
    sha256_of,
    verified,
)

if TYPE_CHECKING:
    from floom.config import Settings

log = logging.getLogger("floom.blobs")

# Error codes an S3-compatible server answers for a key it does not hold.
_ABSENT = {"NoSuchKey", "404", "NotFound"}
# What a digest may hold to become part of a key (a sha256 in hex; a test's short names).
_DIGEST = re.compile(r"[0-9A-Za-z_-]{1,128}")
# Objects one DeleteObjects request may name (S3's own limit).
_DELETE_BATCH = 1000


class S3BlobStore(BlobStore):
    name: ClassVar[str] = "s3"
    inline: ClassVar[bool] = False

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint: str = "",
        region: str = "us-east-1",
        access_key_id: str = "",
        secret_access_key: str = "",
        timeout: float = 10.0,
        max_unsized_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if not bucket:
            raise InvalidRequest(
                "FLOOM_BLOB_STORE=s3 needs a bucket",
                hint="set FLOOM_S3_BUCKET (and FLOOM_S3_ENDPOINT for a server other than "
                "AWS S3); README: Object storage",
            )
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.region = region
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self.timeout = timeout
        self.max_unsized_bytes = max_unsized_bytes
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BlobStore:
        key_id, secret = settings.s3_access_key_id, settings.s3_secret_access_key
        if not key_id and settings.s3_credentials_file is not None:
            key_id, secret = _credentials_file(settings.s3_credentials_file)
        return cls(
            bucket=settings.s3_bucket,
            prefix=settings.s3_prefix,
            endpoint=settings.s3_endpoint,
            region=settings.s3_region,
            access_key_id=key_id,
            secret_access_key=secret,
            timeout=settings.s3_timeout_seconds,
            max_unsized_bytes=largest_blob_bytes(settings),
        )

    @property
    def secret(self) -> str:
        """The secret key floom was given (for redaction); "" when the client finds its own."""
        return self._secret_access_key

    def key(self, digest: str) -> str:
        """The object's key; BlobUnreadable for a digest that is not one name (a row written
        by hand, a backup's): a key is never built of '/' or '..' from a row."""
        if not _DIGEST.fullmatch(digest):
            raise BlobUnreadable(
                f"blob {digest[:80]!r} cannot name an object: a digest is letters, digits, "
                "'-' and '_'",
                hint=told("the blobs table holds a row floom did not write; ", act("blobs check")),
            )
        return f"{self.prefix}blobs/{digest}"

    def describe(self, digest: str) -> str:
        return f"object s3://{self.bucket}/{self.prefix}blobs/{digest[:80]}"

    def put(self, digest: str, data: bytes, *, sha256: str) -> None:
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        self._call(
            "put_object",
            doing=f"store {self.describe(digest)}",
            Bucket=self.bucket,
            Key=self.key(digest),
            Body=data,
            # The server refuses bytes that arrive other than sent.
            ContentMD5=md5,
            Metadata={"sha256": sha256},
        )

    def get(self, digest: str, *, sha256: str | None, what: str, size: int | None) -> bytes:
        where = self.describe(digest)
        try:
            answer = self._call(
                "get_object", doing=f"read {where}", Bucket=self.bucket, Key=self.key(digest)
            )
            body = answer["Body"]
            try:
                # An object replaced in the bucket may be of any size: told by its length
                # before a byte is read, and read no further than floom stored (a row
                # without a size: than the largest blob floom stores).
                declared = int(answer.get("ContentLength", size or 0))
                self._of_size(declared, size=size, what=what, where=where)
                data: bytes = body.read((self.max_unsized_bytes if size is None else size) + 1)
            finally:
                body.close()
        except _Absent:
            raise missing(what=what, where=where) from None
        except _read_errors() as exc:  # the body broke off mid-read
            raise _unavailable(f"read {where}", exc) from exc
        self._of_size(len(data), size=size, what=what, where=where)
        return verified(
            data,
            digest=digest,
            sha256=sha256,
            max_bytes=self.max_unsized_bytes,
            what=what,
            where=where,
        )

    def _of_size(self, held: int, *, size: int | None, what: str, where: str) -> None:
        if size is None:
            over_limit(held, limit=self.max_unsized_bytes, what=what, where=where)
        else:
            of_size(held, size=size, what=what, where=where)

    def exists(self, digest: str) -> int | None:
        """The size of the object held under `digest`, or None when there is none."""
        answer = self._head(digest)
        return None if answer is None else int(answer["ContentLength"])

    def _head(self, digest: str) -> dict[str, Any] | None:
        """What the store says of the object under `digest`, or None when there is none."""
        try:
            return self._call(  # type: ignore[no-any-return]
                "head_object",
                doing=f"look up {self.describe(digest)}",
                Bucket=self.bucket,
                Key=self.key(digest),
            )
        except _Absent:
            return None

    def listing(self) -> Iterator[tuple[str, datetime]]:
        """Every object under floom's prefix that names a blob: its digest and when it was
        last written (services/ops/objects.sweep_objects), a page of keys at a time."""
        folder = f"{self.prefix}blobs/"
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": folder}
        while True:
            page = self._call(
                "list_objects_v2", doing=f"list s3://{self.bucket}/{folder}", **params
            )
            for item in page.get("Contents", []):
                digest = item["Key"][len(folder) :]
                if _DIGEST.fullmatch(digest):
                    yield digest, item["LastModified"]
            if not page.get("IsTruncated"):
                return
            params["ContinuationToken"] = page["NextContinuationToken"]

    def written_at(self, digest: str) -> datetime | None:
        """When the object under `digest` was last written, or None when there is none."""
        answer = self._head(digest)
        return None if answer is None else answer["LastModified"]

    def delete(self, digests: Sequence[str]) -> None:
        keys = [self.key(d) for d in digests]
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = keys[i : i + _DELETE_BATCH]
            answer = self._call(
                "delete_objects",
                doing=f"delete {len(batch)} object(s) from s3://{self.bucket}",
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            failed = [e for e in answer.get("Errors", []) if e.get("Code") not in _ABSENT]
            if failed:
                raise BlobStoreUnavailable(
                    f"the object store refused to delete {len(failed)} object(s) from "
                    f"s3://{self.bucket}: {failed[0].get('Code')} {failed[0].get('Message', '')}",
                    hint="check that floom's S3 credentials may delete objects under "
                    f"{self.prefix or 'the bucket'}",
                    details={"retry_after_seconds": RETRY_AFTER_SECONDS},
                )

    def check(self) -> list[Finding]:
        where = f"s3://{self.bucket}/{self.prefix}"
        try:
            self._call("head_bucket", doing=f"reach {where}", Bucket=self.bucket)
        except BlobStoreUnavailable as exc:
            return [Finding("object store", "fail", exc.message, exc.hint or "")]
        probe = f"doctor-{os.urandom(6).hex()}"
        data = os.urandom(64)
        try:
            self.put(probe, data, sha256=sha256_of(data))
            self.get(
                probe, sha256=sha256_of(data), what="the doctor's probe object", size=len(data)
            )
            self.delete([probe])
        except FloomError as exc:
            message = exc.message
            return [
                Finding("object store", "ok", f"{where} reachable ({self._endpoint_name()})"),
                Finding(
                    "object store writes",
                    "fail",
                    f"writing, reading back and deleting a probe object failed: {message}",
                    "give floom's S3 credentials PutObject, GetObject and DeleteObject on "
                    f"{where}*",
                ),
            ]
        found = [
            Finding("object store", "ok", f"{where} reachable ({self._endpoint_name()})"),
            Finding("object store writes", "ok", "a probe object written, read back, deleted"),
        ]
        found.append(self._versioning_advice())
        return found

    def _versioning_advice(self) -> Finding:
        """Versioning keeps a deleted or overwritten object restorable; then a lifecycle rule
        should expire old versions, or retention never frees space."""
        try:
            status = self._call(
                "get_bucket_versioning", doing="read the bucket's versioning", Bucket=self.bucket
            ).get("Status")
        except BlobStoreUnavailable:
            status = None
        if status != "Enabled":
            return Finding(
                "object store versioning",
                "warn",
                f"versioning is {status or 'off'} on bucket {self.bucket}: an object deleted by "
                "mistake cannot be restored",
                "turn versioning on, with a lifecycle rule that expires noncurrent versions "
                "after a few days (NoncurrentVersionExpiration), so retention still frees space",
            )
        try:
            rules = self._call(
                "get_bucket_lifecycle_configuration",
                doing="read the bucket's lifecycle rules",
                Bucket=self.bucket,
            ).get("Rules", [])
        except BlobStoreUnavailable:
            rules = []
        if not any("NoncurrentVersionExpiration" in r for r in rules):
            return Finding(
                "object store versioning",
                "warn",
                f"versioning is on for bucket {self.bucket} but no lifecycle rule expires "
                "noncurrent versions: objects floom deletes keep their space",
                "add a lifecycle rule with NoncurrentVersionExpiration (e.g. 7 days)",
            )
        return Finding("object store versioning", "ok", "versioning on, noncurrent versions expire")

    def _endpoint_name(self) -> str:
        return self.endpoint or f"AWS S3, {self.region}"

    def _call(self, operation: str, *, doing: str, **params: Any) -> Any:
        """Call the client's `operation`, its errors as floom's: _Absent for a key the server
        does not hold, BlobStoreUnavailable for the rest."""
        client = self._client or self._make_client()
        try:
            return getattr(client, operation)(**params)
        except _client_errors() as exc:
            if _error_code(exc) in _ABSENT:
                raise _Absent from exc
            raise _unavailable(doing, exc) from exc

    def _make_client(self) -> Any:
        # Clients are thread-safe once made; making one is not (boto3's default session).
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                config = Config(
                    region_name=self.region,
                    connect_timeout=min(3.0, self.timeout),
                    read_timeout=self.timeout,
                    retries={"mode": "standard", "total_max_attempts": 3},
                    # Path-style keys work on every S3-compatible server; AWS picks its own.
                    s3={"addressing_style": "path" if self.endpoint else "auto"},
                    # ContentMD5 guards each upload; newer checksum headers are not spoken
                    # by every S3-compatible server.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                )
                credentials = (
                    {
                        "aws_access_key_id": self._access_key_id,
                        "aws_secret_access_key": self._secret_access_key,
                    }
                    if self._access_key_id
                    else {}
                )
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint or None, config=config, **credentials
                )
            return self._client


class _Absent(Exception):
    """The server answered that it holds no such key."""


def _client_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _read_errors() -> tuple[type[Exception], ...]:
    from urllib3.exceptions import HTTPError

    return (*_client_errors(), HTTPError, OSError)


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _unavailable(doing: str, exc: Exception) -> BlobStoreUnavailable:
    code = _error_code(exc)
    reason = code or type(exc).__name__
    if code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}:
        hint = (
            "check floom's S3 credentials (FLOOM_S3_ACCESS_KEY_ID and FLOOM_S3_SECRET_ACCESS_KEY, "
            "or FLOOM_S3_CREDENTIALS_FILE) and what they may do on the bucket"
        )
    elif code == "NoSuchBucket":
        hint = "create the bucket, or set FLOOM_S3_BUCKET to one that exists"
    else:
        hint = (
            "check that the object store is running and reachable (FLOOM_S3_ENDPOINT); "
            "floom tries again shortly"
        )
    log.warning("object store: could not %s: %s", doing, reason)
    return BlobStoreUnavailable(
        f"the object store is unavailable: could not {doing} ({reason})",
        hint=hint,
        details={"retry_after_seconds": RETRY_AFTER_SECONDS},
    )


def _credentials_file(path: Path) -> tuple[str, str]:
    """The [default] key pair of a shared-credentials file (the format AWS tools write)."""
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
        section = parser["default"]
        return section["aws_access_key_id"].strip(), section["aws_secret_access_key"].strip()
    except (OSError, configparser.Error, KeyError) as exc:
        raise InvalidRequest(
            f"FLOOM_S3_CREDENTIALS_FILE {path} holds no usable key pair ({type(exc).__name__})",
            hint="write a [default] section with aws_access_key_id and aws_secret_access_key",
        ) from None
