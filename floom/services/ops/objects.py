"""Blobs and the object store: ended runs' logs moved out of run_events into one blob each,
the store's pending uploads and deletes done once it answers, `floom blobs migrate` between
the database and a bucket, and `floom blobs check`.

Every step is idempotent and resumable: each blob or batch of runs commits on its own, and a
step that the object store interrupts leaves the rest as it was, for the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, text, update
from sqlmodel import col, select

from floom.errors import BlobStoreUnavailable, BlobUnreadable, InvalidRequest
from floom.services.runs import rules as run_rules
from floom.store.blobs.base import BlobStore, sha256_of
from floom.store.blobs.configured import new_blob_store, store_at
from floom.store.blobs.logs import decode_log, encode_log
from floom.store.blobs.rows import (
    DATABASE,
    DELETE,
    UPLOAD,
    StagedBlob,
    delete_unreferenced_blobs,
    insert_blob,
    read_blob,
)
from floom.store.blobs.tables import PendingBlob, RunLog
from floom.store.db import on_postgres, session_scope
from floom.store.models import Blob, Run, RunEvent, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.blobs")

# Runs whose logs one pass moves per transaction, and pending items per pass.
LOG_BATCH = 50
PENDING_BATCH = 100
# Blobs `floom blobs migrate` and `floom blobs check` read per query of the blobs table.
WALK_CHUNK = 100
_FINISHED = sorted(run_rules.FINISHED)

Progress = Callable[[str], None]


def archive_logs(
    ctx: Context,
    *,
    run_ids: Sequence[str] | None = None,
    store: BlobStore | None = None,
    limit: int = LOG_BATCH,
) -> int:
    """Move the logs of up to `limit` ended runs (of `run_ids`, or any that still has lines
    in run_events) into one blob each in `store` (default: where new blobs go; nothing moves
    while that is the database). Lines that came after an earlier move (a cancelled attempt's
    last words) are merged into a new blob. Returns how many runs' logs moved; raises
    BlobStoreUnavailable, changing nothing more, when the store is away."""
    store = store or new_blob_store(ctx.settings, ctx.engine)
    if store.inline:
        return 0
    with session_scope(ctx.engine) as s:
        ended = (
            select(RunEvent.run_id)
            .join(Run, col(Run.id) == col(RunEvent.run_id))
            .where(col(Run.status).in_(_FINISHED))
            .distinct()
        )
        if run_ids is not None:
            ended = ended.where(col(RunEvent.run_id).in_(list(run_ids)))
        chosen = sorted(s.exec(ended.limit(limit)).all())
        if not chosen:
            return 0
        events = list(
            s.exec(
                select(RunEvent)
                .where(col(RunEvent.run_id).in_(chosen))
                .order_by(col(RunEvent.run_id), col(RunEvent.seq))
            ).all()
        )
        earlier = {
            r.run_id: r for r in s.exec(select(RunLog).where(col(RunLog.run_id).in_(chosen)))
        }
    read: dict[str, tuple[int, int]] = {}  # run -> (lines, last seq) as read
    blobs: list[tuple[RunLog, StagedBlob]] = []
    for run_id, group in groupby(events, key=lambda e: e.run_id):
        lines = list(group)
        read[run_id] = (len(lines), lines[-1].seq)
        before = earlier.get(run_id)
        if before is not None:
            what = f"the log of run {run_id}"
            old = read_blob(ctx.settings, ctx.engine, before.digest, what=what)
            lines = [
                e for e in decode_log(run_id, before.digest, old) if e.seq < lines[0].seq
            ] + lines
        data = encode_log(lines)
        sha = sha256_of(data)
        store.put(sha, data, sha256=sha)
        blob = StagedBlob(sha, len(data), sha, store.name, b"")
        blobs.append(
            (RunLog(run_id=run_id, digest=sha, lines=len(lines), last_seq=lines[-1].seq), blob)
        )
    return _record_archives(ctx, blobs, read=read, earlier=earlier)


def _record_archives(
    ctx: Context,
    blobs: list[tuple[RunLog, StagedBlob]],
    *,
    read: dict[str, tuple[int, int]],
    earlier: dict[str, RunLog],
) -> int:
    """One transaction: each run's lines leave run_events as its blob is recorded, unless a
    line came meanwhile (the run is taken again at the next pass)."""
    ids = [archive.run_id for archive, _ in blobs]
    with session_scope(ctx.engine, write=True) as s:
        if on_postgres(s):
            # The lock every appender of a run's lines takes (services/runs/logs.py), in one
            # round trip, in a fixed order (two nodes moving logs never wait on each other
            # in a circle).
            s.execute(
                text(
                    "SELECT count(pg_advisory_xact_lock(hashtext(r))) "
                    "FROM unnest(CAST(:ids AS text[])) AS r"
                ),
                {"ids": sorted(ids)},
            )
        now_held = {
            run_id: (int(n), int(last))
            for run_id, n, last in s.exec(
                select(RunEvent.run_id, func.count(), func.max(RunEvent.seq))
                .where(col(RunEvent.run_id).in_(ids))
                .group_by(col(RunEvent.run_id))
            ).all()
        }
        settled = [(a, b) for a, b in blobs if now_held.get(a.run_id) == read[a.run_id]]
        if not settled:
            return 0
        done = [a.run_id for a, _ in settled]
        for _, blob in settled:
            insert_blob(s, blob)
        s.execute(delete(RunLog).where(col(RunLog.run_id).in_(done)))
        for archive, _ in settled:
            archive.created_at = utcnow()
            s.add(archive)
        s.execute(delete(RunEvent).where(col(RunEvent.run_id).in_(done)))
        replaced = [earlier[r].digest for r in done if r in earlier]
        if replaced:
            s.flush()
            delete_unreferenced_blobs(s, replaced)
    return len(settled)


@dataclass
class PendingReport:
    uploaded: int = 0
    deleted: int = 0


def drain_pending(ctx: Context, *, limit: int = PENDING_BATCH) -> PendingReport:
    """Do up to `limit` of the object store's pending uploads and deletes, oldest first.
    Stops at the first the store refuses (counted in `attempts`, kept for the next pass)."""
    report = PendingReport()
    with session_scope(ctx.engine) as s:
        pending = list(
            s.exec(select(PendingBlob).order_by(col(PendingBlob.created_at)).limit(limit)).all()
        )
    for item in pending:
        try:
            if item.action == UPLOAD:
                report.uploaded += _upload_pending(ctx, item.digest)
            elif item.action == DELETE:
                report.deleted += _delete_pending(ctx, item.digest)
        except BlobStoreUnavailable:
            _count_attempt(ctx, item.digest)
            raise
        except BlobUnreadable as exc:
            # Its bytes are damaged where they are: it stays pending (and listed by `floom
            # blobs check`) without holding up the others.
            log.error("pending %s of blob %s: %s", item.action, item.digest, exc.message)
            _count_attempt(ctx, item.digest)
    return report


def _count_attempt(ctx: Context, digest: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.execute(
            update(PendingBlob)
            .where(col(PendingBlob.digest) == digest)
            .values(attempts=PendingBlob.attempts + 1)
        )


def _upload_pending(ctx: Context, digest: str) -> int:
    store = new_blob_store(ctx.settings, ctx.engine)
    if store.inline:
        # Back to the database: the bytes are where new blobs go.
        _forget_pending(ctx, digest)
        return 0
    return _move_blob(ctx, digest, to=store, source=DATABASE)


def _delete_pending(ctx: Context, digest: str) -> int:
    with session_scope(ctx.engine) as s:
        row = s.exec(select(Blob.location).where(Blob.digest == digest)).first()
    if row is not None:
        # Stored again since: its object is needed (or, held in the database while new blobs
        # go to the bucket, it is an upload now).
        if row == DATABASE and not new_blob_store(ctx.settings, ctx.engine).inline:
            with session_scope(ctx.engine, write=True) as s:
                s.execute(
                    update(PendingBlob)
                    .where(col(PendingBlob.digest) == digest)
                    .values(action=UPLOAD, attempts=0)
                )
            return 0
        _forget_pending(ctx, digest)
        return 0
    store_at("s3", ctx.settings, ctx.engine).delete([digest])
    _forget_pending(ctx, digest)
    return 1


def _forget_pending(ctx: Context, digest: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        s.execute(delete(PendingBlob).where(col(PendingBlob.digest) == digest))


def _move_blob(ctx: Context, digest: str, *, to: BlobStore, source: str) -> int:
    """Move one blob's bytes from the store at `source` to `to`, checked on both sides;
    returns 1 when it moved, 0 when it was moved or deleted meanwhile."""
    with session_scope(ctx.engine) as s:
        row = s.exec(
            select(Blob.size, Blob.sha256).where(Blob.digest == digest, Blob.location == source)
        ).first()
    if row is None:
        _forget_pending(ctx, digest)
        return 0
    size, sha = row
    what = f"blob {digest}"
    data = store_at(source, ctx.settings, ctx.engine).get(digest, sha256=sha, what=what)
    sha = sha or sha256_of(data)  # a blob stored before floom kept checksums gets one now
    to.put(digest, data, sha256=sha)
    if not to.inline:
        held = to.exists(digest)  # type: ignore[attr-defined]
        if held != len(data):
            raise BlobUnreadable(
                f"{what}: {to.describe(digest)} holds {held} bytes after the upload, not "
                f"{len(data)}; the blob stays where it was",
                hint="check the object store's health, then run the migration again",
            )
    with session_scope(ctx.engine, write=True) as s:
        s.execute(
            update(Blob)
            .where(col(Blob.digest) == digest, col(Blob.location) == source)
            .values(location=to.name, data=data if to.inline else b"", sha256=sha, size=size)
        )
        s.execute(delete(PendingBlob).where(col(PendingBlob.digest) == digest))
    if source != DATABASE:
        try:
            store_at(source, ctx.settings, ctx.engine).delete([digest])
        except BlobStoreUnavailable:
            log.warning("blob %s moved to the database; its object stays in the bucket", digest)
    return 1


@dataclass
class BlobMigration:
    """What `floom blobs migrate` did."""

    to: str
    moved: int = 0
    already: int = 0
    logs_archived: int = 0
    bytes_moved: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrate_blobs(ctx: Context, *, to: str, progress: Progress | None = None) -> BlobMigration:
    """Move every blob into the store `to` ("s3" or "database"), one blob per transaction,
    each read back checked against its sha256 and, in a bucket, its size checked after the
    upload. Resumable and idempotent: a blob moved already is passed over, so a run that
    stopped half way is finished by running it again. Moving to the bucket also moves the
    logs of ended runs out of run_events."""
    if to not in ("s3", DATABASE):
        raise InvalidRequest(f"unknown blob store {to!r}", hint="the stores are s3 and database")
    target = store_at(to, ctx.settings, ctx.engine)
    result = BlobMigration(to=to)
    if ctx.settings.blob_store != to:
        result.warnings.append(
            f"FLOOM_BLOB_STORE is {ctx.settings.blob_store}: new blobs still go there; set "
            f"FLOOM_BLOB_STORE={to} on every node"
        )
    with session_scope(ctx.engine) as s:
        result.already = int(
            s.exec(select(func.count()).select_from(Blob).where(Blob.location == to)).one()
        )
    after = ""
    while True:
        with session_scope(ctx.engine) as s:
            chunk = list(
                s.exec(
                    select(Blob.digest, Blob.location, Blob.size)
                    .where(col(Blob.digest) > after, col(Blob.location) != to)
                    .order_by(col(Blob.digest))
                    .limit(WALK_CHUNK)
                ).all()
            )
        if not chunk:
            break
        after = chunk[-1][0]
        for digest, location, size in chunk:
            moved = _move_blob(ctx, digest, to=target, source=location)
            result.moved += moved
            result.bytes_moved += size if moved else 0
        if progress:
            progress(f"{result.moved} blob(s) moved ({result.bytes_moved} bytes)")
    if not target.inline:
        while True:
            moved = archive_logs(ctx, store=target)
            if not moved:
                break
            result.logs_archived += moved
            if progress:
                progress(f"{result.logs_archived} ended run log(s) moved")
    return result


@dataclass
class BlobProblem:
    digest: str
    location: str
    problem: str


def check_blobs(ctx: Context, *, progress: Progress | None = None) -> tuple[int, list[BlobProblem]]:
    """Read every blob back and check it against its sha256: (blobs checked, problems)."""
    checked, problems = 0, list[BlobProblem]()
    after = ""
    while True:
        with session_scope(ctx.engine) as s:
            chunk = list(
                s.exec(
                    select(Blob.digest, Blob.location)
                    .where(col(Blob.digest) > after)
                    .order_by(col(Blob.digest))
                    .limit(WALK_CHUNK)
                ).all()
            )
        if not chunk:
            return checked, problems
        after = chunk[-1][0]
        for digest, location in chunk:
            try:
                read_blob(ctx.settings, ctx.engine, digest, what=f"blob {digest}")
            except (BlobUnreadable, BlobStoreUnavailable) as exc:
                problems.append(BlobProblem(digest, location, exc.message))
            checked += 1
        if progress:
            progress(f"{checked} blob(s) checked, {len(problems)} problem(s)")


def object_store_problem(ctx: Context) -> str | None:
    """Why blobs meant for the object store wait in the database, if some do: for metrics and
    `floom doctor` (None when nothing waits)."""
    with session_scope(ctx.engine) as s:
        waiting = int(s.exec(select(func.count()).select_from(PendingBlob)).one())
    return f"{waiting} blob(s) wait for the object store" if waiting else None
