"""One contract suite over both blob stores (floom/store/blobs/base.py): the database and an
S3-compatible bucket (a real SeaweedFS on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from floom.bundle import Bundle, BundleFile
from floom.config import Settings
from floom.errors import BlobStoreUnavailable, BlobUnreadable
from floom.store.blobs.base import BlobStore, sha256_of
from floom.store.blobs.database import DatabaseBlobStore
from floom.store.blobs.rows import read_blob
from floom.store.blobs.s3 import S3BlobStore
from floom.store.db import make_engine, session_scope
from floom.store.migrate import migrate
from floom.store.models import Blob
from tests.support.ports import free_port
from tests.support.processes.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

WHAT = "artifact 'report.csv' of run r_test"


@pytest.fixture(params=["database", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "database":
        engine = make_engine(f"sqlite:///{tmp_path / 'floom.db'}")
        migrate(engine)
        yield DatabaseBlobStore(engine)
        engine.dispose()
        return
    server: S3Server = request.getfixturevalue("s3_server")
    yield bucket_store(server)


def bucket_store(server: S3Server, **overrides: object) -> S3BlobStore:
    values = server.settings()
    options = {
        "bucket": values["s3_bucket"],
        "prefix": values["s3_prefix"],
        "endpoint": values["s3_endpoint"],
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "timeout": 2.0,
    }
    options.update(overrides)
    return S3BlobStore(**options)


def test_put_bytes_come_back_from_get(store: BlobStore) -> None:
    data = b"a,b\n1,2\n" * 1000
    store.put("d1", data, sha256=sha256_of(data))
    assert store.get("d1", sha256=sha256_of(data), what=WHAT, size=len(data)) == data


def test_putting_a_digest_again_succeeds(store: BlobStore) -> None:
    data = b"same bytes"
    store.put("d2", data, sha256=sha256_of(data))
    store.put("d2", data, sha256=sha256_of(data))
    assert store.get("d2", sha256=sha256_of(data), what=WHAT, size=len(data)) == data


def test_a_digest_never_put_is_unreadable_naming_the_blob_and_where(store: BlobStore) -> None:
    with pytest.raises(BlobUnreadable) as caught:
        store.get("never", sha256=None, what=WHAT, size=None)
    assert WHAT in caught.value.message
    assert store.describe("never") in caught.value.message
    assert caught.value.status == 502


def test_bytes_that_do_not_match_their_sha256_are_unreadable(store: BlobStore) -> None:
    data = b"the bytes"
    store.put("d3", data, sha256=sha256_of(data))
    with pytest.raises(BlobUnreadable) as caught:
        store.get("d3", sha256=sha256_of(b"other bytes"), what=WHAT, size=None)
    assert "damaged" in caught.value.message
    assert WHAT in caught.value.message


def test_deleted_blobs_are_gone_and_deleting_again_is_no_error(store: BlobStore) -> None:
    data = b"to delete"
    store.put("d4", data, sha256=sha256_of(data))
    store.delete(["d4", "never-put"])
    store.delete(["d4"])
    with pytest.raises(BlobUnreadable):
        store.get("d4", sha256=None, what=WHAT, size=None)


def test_check_reports_no_failure_on_a_working_store(store: BlobStore) -> None:
    found = store.check()
    assert found
    assert all(f.status != "fail" for f in found), found


def test_a_damaged_object_in_the_bucket_is_unreadable(s3_server: S3Server) -> None:
    store = bucket_store(s3_server)
    data = b"original"
    store.put("d5", data, sha256=sha256_of(data))
    raw_client(s3_server).put_object(Bucket=store.bucket, Key=store.key("d5"), Body=b"tampered")
    with pytest.raises(BlobUnreadable) as caught:
        store.get("d5", sha256=sha256_of(data), what=WHAT, size=None)
    assert f"s3://{store.bucket}/{store.key('d5')}" in caught.value.message


def test_an_object_replaced_by_one_of_another_size_is_unreadable_before_it_is_read(
    s3_server: S3Server,
) -> None:
    # Whoever can write the bucket can put an object of any size under a blob's key: floom
    # reads no more than the size it stored (the blobs row's), and says what it found.
    store = bucket_store(s3_server)
    data = b"original"
    store.put("d8", data, sha256=sha256_of(data))
    big = 8 * 1024 * 1024
    raw_client(s3_server).put_object(Bucket=store.bucket, Key=store.key("d8"), Body=b"x" * big)
    with pytest.raises(BlobUnreadable) as caught:
        store.get("d8", sha256=sha256_of(data), what=WHAT, size=len(data))
    message = caught.value.message
    assert "damaged" in message
    assert WHAT in message
    assert f"holds {big} bytes, not the {len(data)} floom stored" in message
    # One byte fewer than stored, under the same sha256: unreadable too.
    raw_client(s3_server).put_object(Bucket=store.bucket, Key=store.key("d8"), Body=data[:-1])
    with pytest.raises(BlobUnreadable):
        store.get("d8", sha256=None, what=WHAT, size=len(data))
    store.put("d8", data, sha256=sha256_of(data))
    assert store.get("d8", sha256=sha256_of(data), what=WHAT, size=len(data)) == data


def test_an_object_of_a_row_without_a_size_is_read_no_further_than_any_blob_floom_stores(
    s3_server: S3Server,
) -> None:
    # A blobs row that records no size (written by hand, or restored from an old backup)
    # was read whole, whatever the bucket held under its key: an object put there by anyone
    # who can write the bucket could take the node's memory. Now it is read no further than
    # the largest blob floom stores, and refused naming the blob and the object.
    limit = 1024 * 1024
    store = bucket_store(s3_server, max_unsized_bytes=limit)
    data = b"original"
    store.put("d9", data, sha256=sha256_of(data))
    assert store.get("d9", sha256=sha256_of(data), what=WHAT, size=None) == data
    raw_client(s3_server).put_object(
        Bucket=store.bucket, Key=store.key("d9"), Body=b"x" * (4 * limit)
    )
    for sha256 in (sha256_of(data), None):
        with pytest.raises(BlobUnreadable) as caught:
            store.get("d9", sha256=sha256, what=WHAT, size=None)
        message = caught.value.message
        assert WHAT in message
        assert f"s3://{store.bucket}/{store.key('d9')}" in message
        assert f"more than {limit} bytes" in message


def test_a_digest_that_is_not_one_name_never_becomes_a_key(s3_server: S3Server) -> None:
    # A blobs row written by hand (or restored from a backup) names its object: a '/' or
    # '..' in it would reach another key of the bucket.
    store = bucket_store(s3_server)
    data = b"kept"
    store.put("d9", data, sha256=sha256_of(data))
    for digest in ("../blobs/d9", "x/../d9", "d9/..", "", "d9\n"):
        with pytest.raises(BlobUnreadable) as caught:
            store.get(digest, sha256=None, what=WHAT, size=None)
        assert "cannot name an object" in caught.value.message
        with pytest.raises(BlobUnreadable):
            store.put(digest, b"planted", sha256=sha256_of(b"planted"))
        with pytest.raises(BlobUnreadable):
            store.delete([digest])
    assert store.get("d9", sha256=sha256_of(data), what=WHAT, size=len(data)) == data


def test_an_unreachable_store_is_unavailable_with_a_retry_hint(s3_server: S3Server) -> None:
    store = bucket_store(s3_server, endpoint=f"http://127.0.0.1:{free_port()}", timeout=1.0)
    for call in (
        lambda: store.put("d6", b"x", sha256=sha256_of(b"x")),
        lambda: store.get("d6", sha256=None, what=WHAT, size=None),
        lambda: store.delete(["d6"]),
    ):
        with pytest.raises(BlobStoreUnavailable) as caught:
            call()
        assert caught.value.status == 503
        assert caught.value.details["retry_after_seconds"] > 0
    assert store.check()[0].status == "fail"


def test_wrong_credentials_are_unavailable_naming_the_settings_never_the_secret(
    s3_server: S3Server,
) -> None:
    store = bucket_store(s3_server, secret_access_key="not-the-secret-key")
    with pytest.raises(BlobStoreUnavailable) as caught:
        store.put("d7", b"x", sha256=sha256_of(b"x"))
    said = caught.value.message + (caught.value.hint or "")
    assert "FLOOM_S3_SECRET_ACCESS_KEY" in said
    assert "not-the-secret-key" not in said
    assert SECRET_KEY not in said


def test_the_doctor_advises_versioning_on_a_bucket_without_it(s3_server: S3Server) -> None:
    found = {f.name: f for f in bucket_store(s3_server).check()}
    assert found["object store"].status == "ok"
    assert found["object store writes"].status == "ok"
    assert found["object store versioning"].status == "warn"
    assert "NoncurrentVersionExpiration" in found["object store versioning"].fix


def raw_client(server: S3Server) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def test_a_blob_without_a_sha256_is_read_only_when_its_digest_vouches(store: BlobStore) -> None:
    # A blob stored before floom kept checksums has only its digest to answer for its
    # bytes: the database store took whatever its row held (the bucket checked already).
    data = b"stored before checksums"
    store.put(sha256_of(data), data, sha256=sha256_of(data))
    assert store.get(sha256_of(data), sha256=None, what=WHAT, size=None) == data
    store.put(sha256_of(b"other"), data, sha256=sha256_of(data))
    with pytest.raises(BlobUnreadable) as caught:
        store.get(sha256_of(b"other"), sha256=None, what=WHAT, size=None)
    assert "no sha256 recorded" in caught.value.message
    assert WHAT in caught.value.message


def test_a_database_blob_without_a_sha256_whose_bytes_are_not_its_digest_s_is_unreadable(
    tmp_path: Path,
) -> None:
    # Every blob of a database from before migration 0010 has no sha256 until `floom blobs
    # migrate` moves it: reads (an artifact, a log, a version's archive) and `floom blobs
    # check` took damaged bytes in its row as the blob's. Its digest vouches for it now.
    engine = make_engine(f"sqlite:///{tmp_path / 'floom.db'}")
    migrate(engine)
    bundle = Bundle({"worker.yml": BundleFile("worker.yml", b"name: old\n")})
    archive = bundle.to_archive()
    artifact = b"a,b\n1,2\n"
    rows = {
        sha256_of(artifact): artifact,
        sha256_of(b"the log"): b"THE LOG",  # damaged: the same size, other bytes
        bundle.digest: archive,
        Bundle({"run.py": BundleFile("run.py", b"x")}).digest: archive,  # another's archive
    }
    with session_scope(engine, write=True) as s:
        for digest, data in rows.items():
            s.add(Blob(digest=digest, size=len(data), data=data, sha256=None))
    settings = Settings(database_url=str(engine.url))
    try:
        assert read_blob(settings, engine, sha256_of(artifact), what=WHAT) == artifact
        assert read_blob(settings, engine, bundle.digest, what="the version") == archive
        for digest in list(rows)[1::2]:
            with pytest.raises(BlobUnreadable) as caught:
                read_blob(settings, engine, digest, what="the blob")
            assert "no sha256 recorded" in caught.value.message
            assert f"blob {digest} in the database" in caught.value.message
    finally:
        engine.dispose()
