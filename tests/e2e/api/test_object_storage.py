"""Object storage end to end: a floom server on loopback with FLOOM_BLOB_STORE=s3 and a real
SeaweedFS; runs keep their logs and artifacts in the bucket, and nothing is lost while the
bucket is away (the tests stop it mid-run and start it again)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from sqlalchemy import update
from sqlmodel import col, func, select

from floom.bundle import Bundle, BundleFile
from floom.engine.loops.uploads import ObjectUploads
from floom.errors import BackupInvalid, BlobUnreadable
from floom.services.context import Context
from floom.services.ops import held_logs, objects
from floom.services.ops.backup import MANIFEST, create_backup, restore_backup
from floom.services.ops.doctor import check_blob_store
from floom.services.ops.objects import check_blobs, migrate_blobs
from floom.services.ops.retention import apply_retention
from floom.store.blobs.configured import s3_store
from floom.store.blobs.configured import store_at as configured_store_at
from floom.store.blobs.logs import encode_log
from floom.store.blobs.rows import inline_blob, insert_blob, read_blob, stage_blob
from floom.store.blobs.tables import HeldBack, PendingBlob, RunLog
from floom.store.db import session_scope
from floom.store.models import Artifact, Blob, RunEvent, utcnow
from tests.support.cli import floom
from tests.support.harness import (
    REPO,
    LiveServer,
    deploy_folder,
    fast_settings,
    live_server,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.processes.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

LINES = 40
SCRIPT = f"""
import os, pathlib
for i in range({LINES}):
    print(f"line {{i}}", flush=True)
report = "a,b\\n1,2\\n" * 100 + os.environ["FLOOM_RUN_ID"]
pathlib.Path(os.environ["FLOOM_OUTPUT_DIR"], "report.csv").write_text(report)
"""


def _report(run: dict[str, Any]) -> bytes:
    run_id: str = run["id"]
    return b"a,b\n1,2\n" * 100 + run_id.encode()


def _server(tmp_path: Path, database_url: str, s3: S3Server, **more: Any) -> Any:
    return live_server(
        tmp_path / "data",
        database_url,
        **s3.settings(blob_sweep_seconds=0.3, **more),
    )


def _deploy(srv: LiveServer, tmp_path: Path) -> None:
    with srv.client() as api:
        deploy_folder(api, make_worker(tmp_path / "w", "name: reporter\n", {"run.py": SCRIPT}))


def _run(srv: LiveServer) -> dict[str, Any]:
    with srv.client() as api:
        started = api.post("/api/v1/workers/reporter/runs", json={"inputs": {}})
        assert started.status_code == 202, started.text
        run = wait_for_run(api, started.json()["id"], timeout=60)
    assert run["status"] == "succeeded", run
    return run


def _events(srv: LiveServer, run_id: str, **params: Any) -> list[dict[str, Any]]:
    with srv.client() as api:
        page = api.get(f"/api/v1/runs/{run_id}/logs", params=params)
        assert page.status_code == 200, page.text
    items: list[dict[str, Any]] = page.json()["items"]
    return items


def _log_lines(srv: LiveServer, run_id: str, **params: Any) -> list[str]:
    return [e["line"] for e in _events(srv, run_id, **params) if e["stream"] == "stdout"]


def _counts(ctx: Context, run_id: str) -> dict[str, Any]:
    with session_scope(ctx.engine) as s:
        digest = s.exec(select(Artifact.digest).where(Artifact.run_id == run_id)).one()
        # The run_logs row before the lines, the pending uploads before the blob: on
        # PostgreSQL each read sees what was committed when it began, and a move commits the
        # row and the lines' deletion together, as an upload does the blob's new location
        # and its pending row's deletion (read the other way, a move between the two reads
        # showed the blob still in the database with no upload pending).
        archived = s.get(RunLog, run_id)
        pending = s.exec(select(func.count()).select_from(PendingBlob)).one()
        return {
            "archived": archived,
            "events": s.exec(
                select(func.count()).select_from(RunEvent).where(RunEvent.run_id == run_id)
            ).one(),
            "artifact": s.get(Blob, digest),
            "pending": pending,
        }


def _objects(s3: S3Server, prefix: str) -> set[str]:
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", [])}


def test_a_run_keeps_its_artifacts_and_its_log_in_the_bucket(
    tmp_path: Path, database_url: str, s3_server: S3Server
) -> None:
    with _server(tmp_path, database_url, s3_server) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
        ctx = srv.ctx
        found = wait_until(lambda: (c := _counts(ctx, run["id"]))["archived"] and c)
        assert found["events"] == 0  # the log left run_events in the move
        assert found["artifact"].location == "s3"
        assert found["artifact"].data == b""
        objects = _objects(s3_server, ctx.settings.s3_prefix)
        assert {found["artifact"].digest, found["archived"].digest} <= objects
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]
        every = _events(srv, run["id"])
        assert [e["seq"] for e in every] == list(range(1, len(every) + 1))
        assert _events(srv, run["id"], after=10, limit=5) == every[10:15]
        assert _events(srv, run["id"], tail=3) == every[-3:]
        with srv.client() as api:
            got = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert got.status_code == 200
        assert got.content == _report(run)


def test_runs_ending_while_the_store_is_away_keep_everything_and_upload_after_a_restart(
    tmp_path: Path, database_url: str, own_s3_server: S3Server
) -> None:
    settings = own_s3_server.settings(blob_sweep_seconds=0.3, s3_timeout_seconds=1.0)
    with live_server(tmp_path / "data", database_url, **settings) as srv:
        _deploy(srv, tmp_path)
        _run(srv)  # this node unpacks the version once (its archive is in the bucket)
        own_s3_server.stop()
        run = _run(srv)
        # Kept in the database: the artifact as a pending upload, the log as its rows.
        held = _counts(srv.ctx, run["id"])
        assert held["artifact"].location == "database"
        assert held["pending"] == 1
        assert held["events"] > LINES
        assert held["archived"] is None
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]
        with srv.client() as api:
            got = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert got.status_code == 200
        assert got.content == _report(run)
    # floom restarts before the store is back; then the store comes back.
    with live_server(tmp_path / "data", database_url, **settings) as srv:
        own_s3_server.start()
        moved = wait_until(
            lambda: (c := _counts(srv.ctx, run["id"]))["archived"] and c["pending"] == 0 and c,
            timeout=30,
        )
        assert moved["artifact"].location == "s3"
        assert moved["events"] == 0
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]
        with srv.client() as api:
            got = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert got.status_code == 200
        assert got.content == _report(run)


def test_reads_while_the_store_is_away_answer_503_with_retry_after(
    tmp_path: Path, own_s3_server: S3Server
) -> None:
    database_url = f"sqlite:///{tmp_path / 'floom.db'}"
    with _server(tmp_path, database_url, own_s3_server, s3_timeout_seconds=1.0) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
        wait_until(lambda: _counts(srv.ctx, run["id"])["archived"])
        own_s3_server.stop()
        with srv.client() as api:
            for path in ("artifacts/report.csv", "logs"):
                answer = api.get(f"/api/v1/runs/{run['id']}/{path}")
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == "blob_store_unavailable"
                assert int(answer.headers["Retry-After"]) > 0
        own_s3_server.start()
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]


def test_a_damaged_object_answers_502_naming_the_run_and_the_object(
    tmp_path: Path, s3_server: S3Server
) -> None:
    database_url = f"sqlite:///{tmp_path / 'floom.db'}"
    with _server(tmp_path, database_url, s3_server) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
        wait_until(lambda: _counts(srv.ctx, run["id"])["archived"])  # the third blob
        digest = _counts(srv.ctx, run["id"])["artifact"].digest
        key = f"{srv.ctx.settings.s3_prefix}blobs/{digest}"
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=s3_server.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"tampered")
        with srv.client() as api:
            answer = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert answer.status_code == 502
        error = answer.json()["error"]
        assert error["code"] == "blob_unreadable"
        assert run["id"] in error["message"]
        assert key in error["message"]
        checked, problems = check_blobs(srv.ctx)
        assert [p.digest for p in problems] == [digest]
        assert checked >= 3


def test_retention_deletes_the_objects_of_what_it_deletes(
    tmp_path: Path, s3_server: S3Server
) -> None:
    database_url = f"sqlite:///{tmp_path / 'floom.db'}"
    with _server(tmp_path, database_url, s3_server) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
        found = wait_until(lambda: (c := _counts(srv.ctx, run["id"]))["archived"] and c)
        gone = {found["artifact"].digest, found["archived"].digest}
        prefix = srv.ctx.settings.s3_prefix
        assert gone <= _objects(s3_server, prefix)
        report = apply_retention(srv.ctx, days=1, now=utcnow().replace(year=utcnow().year + 1))
        assert report.runs_pruned == 1
        assert report.log_lines_deleted == found["archived"].lines
        assert not gone & _objects(s3_server, prefix)
        with session_scope(srv.ctx.engine) as s:
            assert s.exec(select(func.count()).select_from(PendingBlob)).one() == 0


def test_blobs_migrate_moves_everything_to_the_bucket_and_back(
    tmp_path: Path, database_url: str, s3_server: S3Server
) -> None:
    # A node on the database store runs first; then its blobs move.
    with live_server(tmp_path / "data", database_url) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
    ctx = Context.open(fast_settings(tmp_path / "data", database_url, **s3_server.settings()))
    try:
        there = migrate_blobs(ctx, to="s3")
        assert there.moved == 2
        assert there.logs_archived == 1
        with session_scope(ctx.engine) as s:
            assert set(s.exec(select(Blob.location)).all()) == {"s3"}
            assert s.exec(select(func.count()).select_from(RunEvent)).one() == 0
        again = migrate_blobs(ctx, to="s3")
        assert (again.moved, again.logs_archived) == (0, 0)
        assert check_blobs(ctx) == (3, [])
        back = migrate_blobs(ctx, to="database")
        assert back.moved == 3
        with session_scope(ctx.engine) as s:
            assert set(s.exec(select(Blob.location)).all()) == {"database"}
            assert all(b.sha256 for b in s.exec(select(Blob)).all())
        assert not _objects(s3_server, ctx.settings.s3_prefix)
        assert check_blobs(ctx) == (3, [])
    finally:
        ctx.engine.dispose()
    with live_server(tmp_path / "data", database_url) as srv:
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]
        with srv.client() as api:
            got = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert got.status_code == 200
        assert got.content == _report(run)


def test_a_backup_holds_the_bucket_s_objects_and_a_restore_puts_them_back(
    tmp_path: Path, s3_server: S3Server
) -> None:
    database_url = f"sqlite:///{tmp_path / 'data' / 'floom.db'}"
    with _server(tmp_path, database_url, s3_server) as srv:
        _deploy(srv, tmp_path)
        run = _run(srv)
        wait_until(lambda: _counts(srv.ctx, run["id"])["archived"])
        settings = srv.ctx.settings
    summary = create_backup(settings=settings, dest=tmp_path / "backup")
    assert len([f for f in summary.files if f.startswith("objects/")]) == 3
    # Restored on a node without a bucket: the blobs are rows of its database again.
    restored = fast_settings(tmp_path / "fresh", f"sqlite:///{tmp_path / 'fresh' / 'floom.db'}")
    restore_backup(settings=restored, source=tmp_path / "backup")
    with live_server(tmp_path / "fresh", restored.resolved_database_url) as srv:
        with session_scope(srv.ctx.engine) as s:
            assert set(s.exec(select(Blob.location)).all()) == {"database"}
        assert _log_lines(srv, run["id"]) == [f"line {i}" for i in range(LINES)]
        with srv.client() as api:
            got = api.get(f"/api/v1/runs/{run['id']}/artifacts/report.csv")
        assert got.status_code == 200
        assert got.content == _report(run)


LEAKY = """import os
print("key:", {secret!r}, os.environ.get("FLOOM_S3_SECRET_ACCESS_KEY"))
"""


def test_the_object_store_secret_never_reaches_a_run_log(
    tmp_path: Path, s3_server: S3Server
) -> None:
    database_url = f"sqlite:///{tmp_path / 'floom.db'}"
    with _server(tmp_path, database_url, s3_server) as srv:
        with srv.client() as api:
            folder = make_worker(
                tmp_path / "leaky",
                "name: leaky\n",
                {"run.py": LEAKY.format(secret=SECRET_KEY)},
            )
            deploy_folder(api, folder)
            started = api.post("/api/v1/workers/leaky/runs", json={"inputs": {}})
            run = wait_for_run(api, started.json()["id"], timeout=60)
        lines = [e["line"] for e in _events(srv, run["id"])]
        assert any(line.startswith("key:") for line in lines), lines
        assert not any(SECRET_KEY in line for line in lines), lines
        # And the sandbox's environment never held it.
        assert any(line.endswith(" None") for line in lines), lines


def test_a_backup_whose_objects_are_not_its_blobs_is_refused_writing_nothing(
    tmp_path: Path, s3_server: S3Server
) -> None:
    # A backup's objects/ are checked against the blobs rows of its database before any is
    # put back: an object whose bytes are not its blob's (its manifest checksum made to
    # agree), one longer than its blob (never read whole), or a blob whose object is missing
    # is refused, naming it, and nothing is written (no data dir, nothing in the bucket).
    settings = fast_settings(
        tmp_path / "data", f"sqlite:///{tmp_path / 'data' / 'floom.db'}", **s3_server.settings()
    )
    ctx = Context.open(settings)
    blobs = [stage_blob(settings, ctx.engine, f"blob {i}".encode() * 100) for i in range(2)]
    with session_scope(ctx.engine, write=True) as s:
        for blob in blobs:
            insert_blob(s, blob)
    ctx.engine.dispose()
    good = tmp_path / "good"
    create_backup(settings=settings, dest=good)
    first, second = (f"objects/{b.digest}" for b in blobs)

    def other_bytes(backup: Path) -> None:
        data = (backup / first).read_bytes()
        (backup / first).write_bytes(b"X" + data[1:])

    def longer(backup: Path) -> None:
        (backup / first).write_bytes((backup / first).read_bytes() + b"more")

    def missing(backup: Path) -> None:
        (backup / second).unlink()
        manifest = json.loads((backup / MANIFEST).read_text())
        manifest["summary"]["files"].remove(second)
        (backup / MANIFEST).write_text(json.dumps(manifest))

    for damage, said in (
        (other_bytes, f"{first} in {tmp_path}/other_bytes does not match its blob's sha256"),
        (longer, f"{first} in {tmp_path}/longer is not the object of a blob"),
        (missing, f"the backup lacks {second}"),
    ):
        backup = tmp_path / damage.__name__
        shutil.copytree(good, backup)
        damage(backup)
        manifest = json.loads((backup / MANIFEST).read_text())
        for name in manifest["summary"]["files"]:
            manifest["sha256"][name] = hashlib.sha256((backup / name).read_bytes()).hexdigest()
        (backup / MANIFEST).write_text(json.dumps(manifest))
        fresh = tmp_path / f"fresh-{damage.__name__}"
        target = fast_settings(fresh, f"sqlite:///{fresh / 'floom.db'}", **s3_server.settings())
        with pytest.raises(BackupInvalid) as refused:
            restore_backup(settings=target, source=backup)
        assert said in refused.value.message, damage.__name__
        assert not fresh.exists(), damage.__name__
        assert not any(s3_store(target).exists(b.digest) for b in blobs), damage.__name__


def _legacy_blobs(settings: Any, ctx: Context) -> tuple[Any, Any, Any, bytes]:
    """Two blobs and a version's archive in the bucket, their rows without a sha256 (stored
    before floom kept checksums), the first's object replaced by other bytes of its size:
    (replaced, good, version, the archive)."""
    bundle = Bundle({"worker.yml": BundleFile("worker.yml", b"name: old\n")})
    archive = bundle.to_archive()
    legacy = [stage_blob(settings, ctx.engine, b"the real bytes %d" % i * 20) for i in range(2)]
    legacy.append(stage_blob(settings, ctx.engine, archive, digest=bundle.digest))
    with session_scope(ctx.engine, write=True) as s:
        for blob in legacy:
            insert_blob(s, blob)
        for blob in legacy:
            s.execute(update(Blob).where(col(Blob.digest) == blob.digest).values(sha256=None))
    store = s3_store(settings)
    store._call(
        "put_object",
        doing="put",
        Bucket=store.bucket,
        Key=store.key(legacy[0].digest),
        Body=b"X" * legacy[0].size,
    )
    return legacy[0], legacy[1], legacy[2], archive


def test_a_blob_without_a_checksum_is_read_from_the_bucket_only_when_its_digest_vouches(
    tmp_path: Path, database_url: str, s3_server: S3Server
) -> None:
    # Every read of a blob stored before floom kept checksums (a run's artifact or log, a
    # version's archive, `floom blobs check`) took whatever the bucket held under its key: an
    # object replaced there (of the same size) was served as the blob. Its digest names its
    # content: bytes that are not what it names are unreadable, said so.
    settings = fast_settings(tmp_path / "data", database_url, **s3_server.settings())
    ctx = Context.open(settings)
    try:
        replaced, good, version, archive = _legacy_blobs(settings, ctx)
        with pytest.raises(BlobUnreadable) as refused:
            read_blob(settings, ctx.engine, replaced.digest, what="the artifact")
        assert "no sha256 recorded" in refused.value.message
        assert read_blob(settings, ctx.engine, good.digest, what="the log") == b"".join(
            b"the real bytes 1" for _ in range(20)
        )
        assert read_blob(settings, ctx.engine, version.digest, what="the version") == archive
        checked, problems = check_blobs(ctx)
        assert (checked, [p.digest for p in problems]) == (3, [replaced.digest])
    finally:
        ctx.engine.dispose()


def test_backup_and_restore_take_a_blob_without_a_checksum_only_when_its_digest_vouches(
    tmp_path: Path, s3_server: S3Server
) -> None:
    # `floom backup` copied whatever the bucket held under a blob without a sha256 into the
    # backup, whose manifest then vouched for it; `floom restore` put back whatever the
    # backup's objects/ held for one. Now a backup of a replaced object fails naming it,
    # and a restore refuses a file that is not what its blob's digest names, writing nothing.
    settings = fast_settings(
        tmp_path / "data", f"sqlite:///{tmp_path / 'data' / 'floom.db'}", **s3_server.settings()
    )
    ctx = Context.open(settings)
    try:
        replaced, good, _, _ = _legacy_blobs(settings, ctx)
        with pytest.raises(BlobUnreadable) as refused:
            create_backup(settings=settings, dest=tmp_path / "bad")
        assert replaced.digest in refused.value.message
        assert "no sha256 recorded" in refused.value.message
        assert not (tmp_path / "bad").exists()
        # With its object restored, the backup is written; then one of its files replaced.
        store = s3_store(settings)
        store.put(replaced.digest, b"the real bytes 0" * 20, sha256=replaced.sha256)
        backup = tmp_path / "backup"
        create_backup(settings=settings, dest=backup)
    finally:
        ctx.engine.dispose()
    fresh = tmp_path / "fresh"
    target = fast_settings(fresh, f"sqlite:///{fresh / 'floom.db'}")
    restore_backup(settings=target, source=backup)  # a good backup restores
    shutil.rmtree(fresh)
    name = f"objects/{good.digest}"
    (backup / name).write_bytes(b"Y" * good.size)
    manifest = json.loads((backup / MANIFEST).read_text())
    manifest["sha256"][name] = hashlib.sha256((backup / name).read_bytes()).hexdigest()
    (backup / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BackupInvalid) as invalid:
        restore_backup(settings=target, source=backup)
    assert f"{name} in {backup} does not hold what its digest names" in invalid.value.message
    assert not fresh.exists()


def test_two_blobs_migrate_runs_at_once_both_finish_moving_each_blob_once(
    tmp_path: Path, database_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two `floom blobs migrate` at once (two operators, two nodes): the second reads a blob's
    # row, then finds its bytes gone from where the row said, as the first moved it
    # meanwhile. That blob is the first's to move, not a damaged one: the second passes it
    # over and finishes, in both directions, and every blob is where it should be, once.
    settings = fast_settings(tmp_path / "data", database_url, **s3_server.settings())
    first, second = Context.open(settings), Context.open(settings)
    data = {f"bytes {i}".encode() * 50 for i in range(5)}
    with session_scope(first.engine, write=True) as s:
        for one in data:
            insert_blob(s, inline_blob(one))
    real = configured_store_at
    late: list[str] = []

    def store_at(location: str, *args: Any) -> Any:
        store = real(location, *args)
        get = store.get

        def first_moves_it(digest: str, **kwargs: Any) -> bytes:
            if not late:  # the first run moves everything between the row read and this get
                late.append(digest)
                with monkeypatch.context() as m:
                    m.setattr(objects, "store_at", real)
                    done = migrate_blobs(first, to=to)
                assert done.moved == len(data)
            return get(digest, **kwargs)

        store.get = first_moves_it  # type: ignore[method-assign]
        return store

    monkeypatch.setattr(objects, "store_at", store_at)
    try:
        for to in ("s3", "database"):
            late.clear()
            assert migrate_blobs(second, to=to).moved == 0
            assert late
            with session_scope(first.engine) as s:
                assert set(s.exec(select(Blob.location)).all()) == {to}
            monkeypatch.setattr(objects, "store_at", real)
            assert check_blobs(first) == (len(data), [])
            monkeypatch.setattr(objects, "store_at", store_at)
        assert not _objects(s3_server, settings.s3_prefix)
    finally:
        first.engine.dispose()
        second.engine.dispose()


def test_blobs_migrate_skips_an_object_whose_bytes_are_not_its_blob_s_and_moves_the_rest(
    tmp_path: Path, s3_server: S3Server
) -> None:
    # A damaged object is not copied into the database: its row still names the bucket and
    # the migration names it at the end; before, it stopped there and moved nothing after.
    settings = fast_settings(
        tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}", **s3_server.settings()
    )
    ctx = Context.open(settings)
    try:
        blobs = [stage_blob(settings, ctx.engine, b"the real bytes %d" % i * 20) for i in range(3)]
        with session_scope(ctx.engine, write=True) as s:
            for blob in blobs:
                insert_blob(s, blob)
        damaged, missing, good = sorted(blobs, key=lambda b: b.digest)
        store = s3_store(settings)
        store._call(
            "put_object", doing="put", Bucket=store.bucket, Key=store.key(damaged.digest), Body=b"x"
        )
        store.delete([missing.digest])

        result = migrate_blobs(ctx, to="database")

        assert result.moved == 1
        assert sorted(p.digest for p in result.skipped) == sorted([damaged.digest, missing.digest])
        assert all(p.location == "s3" for p in result.skipped)
        assert all(p.digest in p.problem for p in result.skipped)
        with session_scope(ctx.engine) as s:
            rows = {b.digest: b for b in s.exec(select(Blob)).all()}
        assert (rows[damaged.digest].location, rows[damaged.digest].data) == ("s3", b"")
        assert rows[missing.digest].location == "s3"
        assert rows[good.digest].location == "database"
        again = migrate_blobs(ctx, to="database")  # resumable: the same two, nothing else
        assert again.moved == 0
        assert len(again.skipped) == 2
    finally:
        ctx.engine.dispose()


def _lose_earlier_log(ctx: Context, run_id: str) -> tuple[Any, bytes, int]:
    """Make the first five lines of ended run `run_id` an earlier log in the bucket (as a
    cancelled attempt's end leaves it, later lines still in run_events), then lose its
    object: (the blob, its bytes, the last seq it held)."""
    with session_scope(ctx.engine, write=True) as s:
        first = list(
            s.exec(
                select(RunEvent).where(RunEvent.run_id == run_id).order_by(col(RunEvent.seq))
            ).all()
        )[:5]
        earlier = encode_log(first)
        blob = stage_blob(ctx.settings, ctx.engine, earlier)
        insert_blob(s, blob)
        s.add(RunLog(run_id=run_id, digest=blob.digest, lines=5, last_seq=first[-1].seq))
        for event in first:
            s.delete(event)
    s3_store(ctx.settings).delete([blob.digest])
    return blob, earlier, first[-1].seq


def test_a_run_whose_earlier_log_object_is_missing_holds_up_no_other_log_and_no_upload(
    tmp_path: Path, database_url: str, s3_server: S3Server
) -> None:
    # An ended run with lines after an earlier move (a cancelled attempt's last words) whose
    # earlier log object the bucket lost: merging them needs that object. It stays as it
    # is, named, while every other run's log moves and the pending uploads are done; before,
    # `floom blobs migrate --to s3` stopped on it every time, and the upkeep loop failed its
    # every pass there, uploading nothing more. Once the object is back, a re-run moves it.
    with live_server(tmp_path / "data", database_url) as srv:
        _deploy(srv, tmp_path)
        runs = sorted(_run(srv)["id"] for _ in range(3))
    bucket = s3_server.settings()
    settings = fast_settings(tmp_path / "data", database_url, **bucket)
    ctx = Context.open(settings)
    poison = runs[0]
    try:
        blob, earlier, _ = _lose_earlier_log(ctx, poison)
        store = s3_store(settings)

        result = migrate_blobs(ctx, to="s3")

        assert result.logs_archived == 2
        [problem] = [p for p in result.skipped if p.digest == blob.digest]
        assert poison in problem.problem
        assert "missing" in problem.problem
        with session_scope(ctx.engine) as s:
            left = set(s.exec(select(RunEvent.run_id)).all())
        assert left == {poison}
        # The upkeep loop's pass: the same run passed over, a pending upload still done.
        waiting = inline_blob(b"waiting for the bucket")
        with session_scope(ctx.engine, write=True) as s:
            insert_blob(s, waiting)
            s.add(PendingBlob(digest=waiting.digest, action="upload"))
        ObjectUploads(ctx)._sweep()
        with session_scope(ctx.engine) as s:
            assert s.get(Blob, waiting.digest).location == "s3"  # type: ignore[union-attr]
            assert s.exec(select(func.count()).select_from(PendingBlob)).one() == 0

        store.put(blob.digest, earlier, sha256=blob.sha256)
        again = migrate_blobs(ctx, to="s3")
        assert (again.logs_archived, again.skipped) == (1, [])
        with session_scope(ctx.engine) as s:
            assert s.exec(select(func.count()).select_from(RunEvent)).one() == 0
    finally:
        ctx.engine.dispose()
    with live_server(tmp_path / "data", database_url, **bucket) as srv:
        assert _log_lines(srv, poison) == [f"line {i}" for i in range(LINES)]


def test_a_held_back_run_log_is_said_once_per_process_and_named_by_floom_doctor(
    tmp_path: Path, database_url: str, s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    # A run passed over by log archiving (its earlier log object missing) was logged at error
    # level at every upkeep sweep of every node until the object came back, and nothing an
    # operator looks at said it. Now each process says it once (then once an hour, with how
    # many passes met it), and `floom doctor` counts and names such runs, with the fix.
    with live_server(tmp_path / "data", database_url) as srv:
        _deploy(srv, tmp_path)
        poison = _run(srv)["id"]
    settings = fast_settings(tmp_path / "data", database_url, **s3_server.settings())
    ctx = Context.open(settings)
    try:
        blob, earlier, _ = _lose_earlier_log(ctx, poison)
        store = s3_store(settings)
        with caplog.at_level("ERROR", logger="floom.blobs"):
            for _ in range(3):  # three upkeep sweeps of this node
                ObjectUploads(ctx)._sweep()
        said = [r for r in caplog.records if poison in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        [healthy] = [c for c in check_blob_store(settings) if c.name == "held-back run logs"]
        assert healthy.status == "warn"
        assert "1 ended run(s)' logs stay in the database" in healthy.detail
        assert poison in healthy.detail
        assert "restore each object" in str(healthy.to_dict()["fix"])

        store.put(blob.digest, earlier, sha256=blob.sha256)
        ObjectUploads(ctx)._sweep()
        [cured] = [c for c in check_blob_store(settings) if c.name == "held-back run logs"]
        assert cured.status == "ok", cured
        assert cured.detail.startswith("no ended run's log is held back"), cured
    finally:
        ctx.engine.dispose()


def test_held_back_run_logs_are_counted_by_healthz_and_metrics_listed_and_given_up(
    tmp_path: Path, database_url: str, s3_server: S3Server
) -> None:
    # Was: `floom doctor` read back at most 50 candidates from the bucket and said a count
    # that was "at least"; /healthz and /metrics said nothing; no command listed them all or
    # let an operator give up a lost earlier log, so such a run's lines stayed in the
    # database and its log answered 502 for good. Now the upkeep marks them (one partial
    # index counts them), `floom blobs held-back` lists and retries them, and `floom blobs
    # give-up` puts a line saying what was lost in place of the earlier log and moves the
    # rest.
    with live_server(tmp_path / "data", database_url) as srv:
        _deploy(srv, tmp_path)
        poison, other = (_run(srv)["id"] for _ in range(2))
    bucket = s3_server.settings()
    settings = fast_settings(tmp_path / "data", database_url, **bucket)
    ctx = Context.open(settings)
    try:
        blob, _, last_seq = _lose_earlier_log(ctx, poison)
        assert held_logs.held_back_count(ctx.engine) == 0  # not found by a pass yet
        ObjectUploads(ctx)._sweep()
        [held] = held_logs.all_held_back(ctx.engine)
        assert (held.run_id, held.worker, held.digest, held.last_seq) == (
            poison,
            "reporter",
            blob.digest,
            last_seq,
        )
        assert "missing" in held.problem
        again = held_logs.retry_held_logs(ctx)
        assert (list(again.held), again.moved) == ([poison], [])
    finally:
        ctx.engine.dispose()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")},
        "PYTHONPATH": str(REPO),
        "FLOOM_DATA_DIR": str(tmp_path / "data"),
        "FLOOM_DATABASE_URL": database_url,
        "FLOOM_SECRET_KEY": "test-secret-key",
        **s3_server.env(bucket),
    }
    with live_server(tmp_path / "data", database_url, **bucket) as srv:
        with srv.client() as api:
            assert api.get("/healthz").json()["held_back_run_logs"] == 1
            assert "\nfloom_run_logs_held_back 1.0\n" in api.get("/metrics").text
        listed = floom("blobs", "held-back", "--json", env=env)
        assert listed.returncode == 1, listed.stderr
        [shown] = json.loads(listed.stdout)["held_back"]
        assert (shown["run_id"], shown["last_seq"]) == (poison, last_seq)
        refused = floom("blobs", "give-up", other, env=env)
        assert refused.returncode == 1
        assert f"run {other}: its log is not held back" in refused.stderr
        given = floom("blobs", "give-up", poison, env=env)
        assert given.returncode == 0, given.stderr
        assert f"run {poison}: lost lines given up" in given.stdout
        with srv.client() as api:
            assert api.get("/healthz").json()["held_back_run_logs"] == 0
            assert "\nfloom_run_logs_held_back 0.0\n" in api.get("/metrics").text
        events = _events(srv, poison)
        assert events[0]["seq"] == last_seq
        assert events[0]["stream"] == "system"
        assert f"lines 1 to {last_seq} of this log were lost" in events[0]["line"]
        assert blob.digest in events[0]["line"]
        assert [e["seq"] for e in events] == list(range(last_seq, last_seq + len(events)))
        stdout = [e["line"] for e in events if e["stream"] == "stdout"]
        assert stdout == [f"line {i}" for i in range(LINES)][-len(stdout) :]
        with session_scope(srv.ctx.engine) as s:
            assert s.get(Blob, blob.digest) is None  # released with the log it was
            assert s.get(HeldBack, poison) is None
            assert (
                s.exec(
                    select(func.count()).select_from(RunEvent).where(RunEvent.run_id == poison)
                ).one()
                == 0
            )  # the rest moved into the bucket
        again_listed = floom("blobs", "held-back", env=env)
        assert again_listed.returncode == 0, again_listed.stderr
        assert "0 run log(s) held back" in again_listed.stdout


def test_blobs_migrate_moves_a_blob_without_a_checksum_only_when_its_digest_vouches_for_it(
    tmp_path: Path, s3_server: S3Server
) -> None:
    # A blob stored before floom kept checksums has no sha256 to check its bytes against: the
    # migration recorded one for whatever the bucket held, so an object replaced there (of
    # the same size) came back as a checked blob. Its digest names its content (an
    # artifact's or a log's is the bytes' sha256, a version's the archive's files'): bytes
    # that are not what it names stay where they are, skipped and named.
    settings = fast_settings(
        tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}", **s3_server.settings()
    )
    ctx = Context.open(settings)
    try:
        bundle = Bundle({"worker.yml": BundleFile("worker.yml", b"name: old\n")})
        archive = bundle.to_archive()
        legacy = [
            stage_blob(settings, ctx.engine, b"the real bytes %d" % i * 20) for i in range(2)
        ] + [stage_blob(settings, ctx.engine, archive, digest=bundle.digest)]
        with session_scope(ctx.engine, write=True) as s:
            for blob in legacy:
                insert_blob(s, blob)
            for blob in legacy:
                s.execute(update(Blob).where(col(Blob.digest) == blob.digest).values(sha256=None))
        replaced, good, version = legacy
        store = s3_store(settings)
        store._call(
            "put_object",
            doing="put",
            Bucket=store.bucket,
            Key=store.key(replaced.digest),
            Body=b"X" * replaced.size,
        )

        result = migrate_blobs(ctx, to="database")

        assert result.moved == 2
        [skipped] = result.skipped
        assert skipped.digest == replaced.digest
        assert "no sha256" in skipped.problem
        with session_scope(ctx.engine) as s:
            rows = {b.digest: b for b in s.exec(select(Blob)).all()}
        assert (rows[replaced.digest].location, rows[replaced.digest].sha256) == ("s3", None)
        assert rows[good.digest].sha256 == hashlib.sha256(rows[good.digest].data).hexdigest()
        assert rows[version.digest].data == archive
    finally:
        ctx.engine.dispose()
