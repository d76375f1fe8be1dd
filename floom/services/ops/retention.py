"""Retention: finished runs' logs and artifacts go after N days, and blobs nothing refers to
any more (a retried attempt's artifacts, a purged worker's leftovers) are reclaimed, in the
database and in the bucket (objects no blob row names).

N is FLOOM_RETENTION_DAYS (0: keep forever), or a worker's own `retention_days` in its
active version's worker.yml, which wins (0 there keeps that worker's runs forever). The run
rows stay, with inputs, outputs, status and usage: history and counts do not change. Runs
that are queued, running or awaiting approval are never touched, however old.

Webhook and Composio deliveries go with the same N as their worker's runs (the keys that
must still refuse them sent again stay as tombstones), and tombstones whose key guards
nothing any more go: past their expiry, or 7 days after they came for a timestamped scheme
(floom/services/ops/deliveries.py).

Old alert events, closed incidents and sent deliveries go too, after
FLOOM_ALERT_RETENTION_DAYS (floom/services/alerts/retention.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, exists, or_
from sqlmodel import col, select

from floom import jsonvalues
from floom.errors import BlobStoreUnavailable, Conflict
from floom.hints import act, told
from floom.hints import cli as cli_hints
from floom.services.alerts.retention import prune_alerts
from floom.services.ops import deliveries
from floom.services.ops.nodes import live_nodes
from floom.services.ops.objects import drain_pending, sweep_objects
from floom.services.runs import rules as run_rules
from floom.store.blobs.rows import delete_unreferenced_blobs
from floom.store.blobs.tables import HeldBack, RunLog
from floom.store.db import (
    give_back_free_pages,
    let_writers_through,
    rebuild_sqlite_file,
    session_scope,
    sqlite_file_needs_rebuild,
)
from floom.store.models import Artifact, Blob, Run, RunEvent, Version, Worker, utcnow
from floom.store.triggers import WebhookDelivery

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.retention")

# Runs pruned per batch, and log lines deleted per transaction: a run's log may hold
# hundreds of thousands of lines, so a transaction is bounded by rows, not by runs, and holds
# the write lock briefly; waiting writers (heartbeats, claims) go between two.
BATCH_RUNS = 200
PRUNE_STEP_ROWS = 5000
# Blob digests looked at per statement by the orphan sweep.
SWEEP_CHUNK = 500
# A blob younger than this is never reclaimed: an agent stores its workspace blob before the
# transcript that refers to it, up to a run's longest timeout (a day) earlier.
ORPHAN_GRACE = timedelta(days=2)
_FINISHED = sorted(run_rules.FINISHED)


@dataclass
class RetentionReport:
    """What one pass deleted."""

    runs_pruned: int = 0
    log_lines_deleted: int = 0
    artifacts_deleted: int = 0
    blobs_deleted: int = 0
    # Objects in the bucket that no blob row named (an end never recorded, a failed move).
    objects_deleted: int = 0
    alert_events_deleted: int = 0
    alert_incidents_deleted: int = 0
    alert_deliveries_deleted: int = 0
    webhook_deliveries_deleted: int = 0
    delivery_tombstones_deleted: int = 0
    pages_freed: int = 0  # SQLite pages given back to the disk

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worker_retention(ctx: Context) -> dict[str, int]:
    """Each worker's own `retention_days`, from its active version, where it sets one."""
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Worker.name, Version.manifest_json).where(
                col(Worker.active_version_id) == col(Version.id)
            )
        ).all()
    found = {}
    for name, manifest_json in rows:
        days = jsonvalues.stored(manifest_json, expect=dict).get("retention_days")
        if isinstance(days, int) and days >= 0:
            found[name] = days
    return found


def apply_retention(
    ctx: Context,
    *,
    days: int | None = None,
    alert_days: int | None = None,
    now: datetime | None = None,
    batch_runs: int = BATCH_RUNS,
    max_batches: int | None = None,
) -> RetentionReport:
    """Delete the logs and artifacts of runs finished more than their retention ago, in
    batches of `batch_runs` runs (each its own transaction), then reclaim unreferenced blobs.

    `days` overrides FLOOM_RETENTION_DAYS for workers without their own key, `alert_days`
    FLOOM_ALERT_RETENTION_DAYS. Idempotent: a second pass finds nothing more to delete.
    `max_batches` bounds the work of one call (and of each kind of alert row).
    """
    now = now or utcnow()
    default = ctx.settings.retention_days if days is None else days
    own = worker_retention(ctx)
    report = RetentionReport()
    groups: list[tuple[int, Any]] = [
        (d, col(Run.worker_name).in_([w for w, wd in own.items() if wd == d]))
        for d in sorted({d for d in own.values() if d > 0})
    ]
    if default > 0:
        groups.append((default, col(Run.worker_name).not_in(list(own))))
    batches = 0
    for group_days, which in groups:
        cutoff = now - timedelta(days=group_days)
        while max_batches is None or batches < max_batches:
            if not _prune_batch(ctx, which=which, cutoff=cutoff, limit=batch_runs, into=report):
                break
            batches += 1
    _prune_webhook_deliveries(ctx, own=own, default=default, now=now, into=report)
    alerts = prune_alerts(
        ctx,
        days=ctx.settings.alert_retention_days if alert_days is None else alert_days,
        now=now,
        max_batches=max_batches,
    )
    report.alert_events_deleted = alerts.events
    report.alert_incidents_deleted = alerts.incidents
    report.alert_deliveries_deleted = alerts.deliveries
    report.blobs_deleted += sweep_orphan_blobs(ctx, now=now)
    delete_objects_now(ctx)
    report.objects_deleted = sweep_orphan_objects(ctx, now=now)
    # In short steps that let heartbeats and other writers through, and a WAL that a reader
    # kept from being truncated last time is truncated now: so every pass, not only one
    # that deleted something.
    report.pages_freed = give_back_free_pages(ctx.engine)
    if any(report.to_dict().values()) and sqlite_file_needs_rebuild(ctx.engine):
        log.warning(
            "this SQLite file was made before floom gave free pages back to the disk: %s",
            cli_hints.written(
                told("run ", act("retention compact"), " once, with floom stopped, to rebuild it")
            ),
        )
    return report


def _prune_webhook_deliveries(
    ctx: Context, *, own: dict[str, int], default: int, now: datetime, into: RetentionReport
) -> None:
    """Deliveries by their worker's retention (as its runs); then the tombstones no key
    needs."""
    groups: list[tuple[int, Any]] = [
        (d, col(WebhookDelivery.worker_name).in_([w for w, wd in own.items() if wd == d]))
        for d in sorted({d for d in own.values() if d > 0})
    ]
    if default > 0:
        groups.append((default, col(WebhookDelivery.worker_name).not_in(list(own))))

    def write() -> Any:
        return session_scope(ctx.engine, write=True)

    for group_days, which in groups:
        cutoff = now - timedelta(days=group_days)
        while gone := deliveries.prune_deliveries(write, which=which, cutoff=cutoff, now=now):
            into.webhook_deliveries_deleted += gone
    into.delivery_tombstones_deleted = deliveries.prune_tombstones(write, now=now)


def delete_objects_now(ctx: Context) -> None:
    """Delete from the object store the objects of the blobs just reclaimed; left pending
    (retried by every node's uploads loop) while the store is away."""
    try:
        while drain_pending(ctx).deleted:
            pass
    except BlobStoreUnavailable as exc:
        log.warning("objects of reclaimed blobs left for later: %s", exc.message)


def sweep_orphan_objects(ctx: Context, *, now: datetime | None = None) -> int:
    """Delete the bucket's objects older than ORPHAN_GRACE that no blob row names (an
    upload whose end or move was never recorded); left for the next pass while the bucket
    is away."""
    try:
        return sweep_objects(ctx, older_than=(now or utcnow()) - ORPHAN_GRACE)
    except BlobStoreUnavailable as exc:
        log.warning("unreferenced objects left for later: %s", exc.message)
        return 0


def _prune_batch(
    ctx: Context, *, which: Any, cutoff: datetime, limit: int, into: RetentionReport
) -> bool:
    """Prune up to `limit` runs; False when none was left to prune. Their log lines go
    PRUNE_STEP_ROWS at a time, a transaction each, letting waiting writers through between
    two; then the rest (archived logs, artifacts, blobs) in one. A pass cut short leaves
    the runs still found by the next (the last transaction deletes what found them)."""
    has_logs = exists().where(col(RunEvent.run_id) == col(Run.id))
    has_archived_log = exists().where(col(RunLog.run_id) == col(Run.id))
    has_files = exists().where(col(Artifact.run_id) == col(Run.id))
    with session_scope(ctx.engine) as s:
        run_ids = list(
            s.exec(
                select(Run.id)
                .where(
                    which,
                    col(Run.status).in_(_FINISHED),
                    col(Run.finished_at) < cutoff,
                    or_(has_logs, has_archived_log, has_files),
                )
                .order_by(col(Run.finished_at))
                .limit(limit)
            ).all()
        )
    if not run_ids:
        return False
    into.log_lines_deleted += _delete_log_lines(ctx, run_ids)
    with session_scope(ctx.engine, write=True) as s:
        digests = set(s.exec(select(Artifact.digest).where(col(Artifact.run_id).in_(run_ids))))
        archived = list(s.exec(select(RunLog).where(col(RunLog.run_id).in_(run_ids))))
        digests.update(a.digest for a in archived)
        lines = s.execute(delete(RunEvent).where(col(RunEvent.run_id).in_(run_ids)))
        s.execute(delete(RunLog).where(col(RunLog.run_id).in_(run_ids)))
        s.execute(delete(HeldBack).where(col(HeldBack.run_id).in_(run_ids)))
        files = s.execute(delete(Artifact).where(col(Artifact.run_id).in_(run_ids)))
        into.runs_pruned += len(run_ids)
        into.log_lines_deleted += int(getattr(lines, "rowcount", 0) or 0)
        into.log_lines_deleted += sum(a.lines for a in archived)
        into.artifacts_deleted += int(getattr(files, "rowcount", 0) or 0)
        into.blobs_deleted += delete_unreferenced_blobs(s, digests)
    return True


def _delete_log_lines(ctx: Context, run_ids: list[str]) -> int:
    """Delete the log lines of `run_ids`, PRUNE_STEP_ROWS per transaction; answers how many
    went."""
    deleted = 0
    while True:
        step = select(RunEvent.id).where(col(RunEvent.run_id).in_(run_ids)).limit(PRUNE_STEP_ROWS)
        with session_scope(ctx.engine, write=True) as s:
            gone = s.execute(delete(RunEvent).where(col(RunEvent.id).in_(step.scalar_subquery())))
        count = int(getattr(gone, "rowcount", 0) or 0)
        deleted += count
        if count < PRUNE_STEP_ROWS:
            return deleted
        let_writers_through(ctx.engine)


def sweep_orphan_blobs(ctx: Context, *, now: datetime | None = None) -> int:
    """Delete blobs older than ORPHAN_GRACE that no version, artifact or agent workspace
    refers to; returns how many went. Walks the blobs by digest, a chunk per transaction."""
    before = (now or utcnow()) - ORPHAN_GRACE
    deleted = 0
    after = ""
    while True:
        with session_scope(ctx.engine) as s:
            chunk = list(
                s.exec(
                    select(Blob.digest)
                    .where(col(Blob.digest) > after, col(Blob.created_at) < before)
                    .order_by(col(Blob.digest))
                    .limit(SWEEP_CHUNK)
                ).all()
            )
        if not chunk:
            return deleted
        after = chunk[-1]
        with session_scope(ctx.engine, write=True) as s:
            deleted += delete_unreferenced_blobs(s, chunk)


def compact_store(ctx: Context) -> int:
    """`floom retention compact`: give a SQLite file's free pages back to the disk now. A file
    made before floom turned auto_vacuum on is rebuilt with VACUUM, which holds the write lock
    for the whole rewrite (a heartbeat waiting that long loses every running attempt), so it
    refuses while a node serves the file; any other file gets the steps a pass takes. Answers
    how many pages were free; PostgreSQL answers 0 (its autovacuum keeps the space)."""
    if not sqlite_file_needs_rebuild(ctx.engine):
        return give_back_free_pages(ctx.engine)
    live = live_nodes(ctx.engine)
    if live:
        node = live[0]
        raise Conflict(
            f"floom node {node.id} (roles {node.roles}) is serving this database: rebuilding "
            "it holds the write lock for the whole rewrite, which would stall its runs",
            hint=told(
                "stop floom first, then run ",
                act("retention compact"),
                " again; a node killed without a clean stop counts as stopped once silent for "
                f"its lease ({node.lease_seconds:.0f} s)",
            ),
            details={"node": node.id},
        )
    return rebuild_sqlite_file(ctx.engine)
