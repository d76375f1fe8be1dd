"""Held-back run logs: ended runs whose later lines wait in run_events because the earlier log
they must be merged into (its object in the bucket) is missing or damaged. Counted for
/healthz, /metrics and `floom doctor`, listed, retried, and given up by an operator
(`floom blobs held-back`, `floom blobs give-up`).

The upkeep's passes mark them (run_logs.held_back, services/ops/objects.py) and the move that
replaces the row unmarks them, so counting reads one partial index, never the bucket.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlalchemy import select as core_select
from sqlmodel import select

from floom.errors import InvalidRequest
from floom.services.ops.objects import BlobProblem, archive_logs
from floom.services.runs.logs import lock_events
from floom.store.blobs.configured import new_blob_store
from floom.store.blobs.rows import delete_unreferenced_blobs
from floom.store.blobs.tables import HeldBack, RunLog
from floom.store.db import read_connection, session_scope
from floom.store.models import Blob, Run, RunEvent, utcnow

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from floom.services.context import Context

# Held-back logs listed per page, and retried or given up per pass.
PAGE = 100
# Runs one `floom blobs give-up` names, at most.
MOST_NAMED = 1000


@dataclass(frozen=True)
class HeldBackLog:
    run_id: str
    worker: str
    # The earlier log: its blob, where it is, and the last line it held (the lines up to it
    # are in it; those after wait in run_events).
    digest: str
    location: str
    last_seq: int
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _current() -> Any:
    """held_back_logs rows whose run's log is still the earlier log they name."""
    held, logs = HeldBack.__table__, RunLog.__table__  # type: ignore[attr-defined]
    return held.join(logs, (logs.c.run_id == held.c.run_id) & (logs.c.digest == held.c.digest))


def held_back_count(engine: Engine) -> int:
    """How many ended runs' logs are held back, as the upkeep's passes last found them."""
    with read_connection(engine) as c:
        return int(c.execute(core_select(func.count()).select_from(_current())).scalar_one())


def held_back_logs(engine: Engine, *, after: str = "", limit: int = PAGE) -> list[HeldBackLog]:
    """Held-back logs by run id, from the first after `after`, at most `limit`."""
    held, logs = HeldBack.__table__, RunLog.__table__  # type: ignore[attr-defined]
    runs, blobs = Run.__table__, Blob.__table__  # type: ignore[attr-defined]
    with read_connection(engine) as c:
        rows = c.execute(
            core_select(
                held.c.run_id,
                runs.c.worker_name,
                held.c.digest,
                blobs.c.location,
                logs.c.last_seq,
                held.c.problem,
            )
            .select_from(
                _current()
                .join(runs, runs.c.id == held.c.run_id)
                .outerjoin(blobs, blobs.c.digest == held.c.digest)
            )
            .where(held.c.run_id > after)
            .order_by(held.c.run_id)
            .limit(limit)
        ).all()
    return [
        HeldBackLog(run, worker, digest, location or "", last_seq, problem)
        for run, worker, digest, location, last_seq, problem in rows
    ]


def all_held_back(engine: Engine) -> list[HeldBackLog]:
    found: list[HeldBackLog] = []
    while page := held_back_logs(engine, after=found[-1].run_id if found else ""):
        found += page
    return found


@dataclass
class HeldBackOutcome:
    """What a retry or a give-up did, run by run."""

    # Moved into the bucket: their earlier object was readable again.
    moved: list[str] = field(default_factory=list)
    # Given up: the earlier lines are gone, the later ones are the run's log.
    given_up: list[str] = field(default_factory=list)
    # Still held back (a retry), each run with its earlier log and why.
    held: dict[str, BlobProblem] = field(default_factory=dict)
    # Named, but not held back (no such run, or its log is not held back).
    not_held: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def retry_held_logs(ctx: Context, *, run_ids: list[str] | None = None) -> HeldBackOutcome:
    """Try to move held-back logs now (all, or those of `run_ids`): those whose earlier
    object is readable again move (and are no longer held back); the others stay, each with
    why. Raises BlobStoreUnavailable while the bucket is away, changing nothing."""
    outcome = HeldBackOutcome()
    targets = _targets(ctx.engine, run_ids, outcome)
    if new_blob_store(ctx.settings, ctx.engine).inline:
        raise InvalidRequest(
            "new blobs go to the database (FLOOM_BLOB_STORE=database): run logs are not "
            "moved, so none can be retried",
            hint="set FLOOM_BLOB_STORE=s3 with the FLOOM_S3_* settings of the bucket",
        )
    for i in range(0, len(targets), PAGE):
        batch = targets[i : i + PAGE]
        passed_over: dict[str, BlobProblem] = {}
        archive_logs(ctx, run_ids=batch, limit=len(batch), passed_over=passed_over)
        for run_id in batch:
            if run_id in passed_over:
                outcome.held[run_id] = passed_over[run_id]
            else:
                outcome.moved.append(run_id)
    return outcome


def give_up_held_logs(ctx: Context, *, run_ids: list[str] | None = None) -> HeldBackOutcome:
    """Give up the missing or damaged earlier log of held-back runs (all, or those of
    `run_ids`): each is first retried, and one whose object is readable again just moves.
    For the others, in one transaction each, a system line saying which lines were lost
    (and, for an agent run, that its transcript and tool calls went with them) takes the
    place of the earlier log, whose blob is released (deleted once nothing else uses it),
    and the later lines are then the run's whole log, moved into a new blob. Raises
    BlobStoreUnavailable while the bucket is away, having given up nothing."""
    tried = retry_held_logs(ctx, run_ids=run_ids)
    outcome = HeldBackOutcome(moved=tried.moved, not_held=tried.not_held)
    for run_id, problem in tried.held.items():
        if _give_up(ctx, run_id, digest=problem.digest):
            outcome.given_up.append(run_id)
        else:
            outcome.not_held.append(run_id)
    for i in range(0, len(outcome.given_up), PAGE):
        batch = outcome.given_up[i : i + PAGE]
        archive_logs(ctx, run_ids=batch, limit=len(batch))
    return outcome


def _give_up(ctx: Context, run_id: str, *, digest: str) -> bool:
    """Replace run `run_id`'s held-back earlier log (`digest`) by a line saying it was lost;
    False when it is no longer that log, or no longer held back (moved meanwhile)."""
    with session_scope(ctx.engine, write=True) as s:
        lock_events(s, run_id=run_id)
        row = s.exec(select(RunLog).where(RunLog.run_id == run_id).with_for_update()).first()
        held = s.get(HeldBack, run_id)
        if row is None or row.digest != digest or held is None or held.digest != digest:
            return False
        attempt = s.exec(select(Run.attempt).where(Run.id == run_id)).first() or 1
        s.add(
            RunEvent(
                run_id=run_id,
                seq=row.last_seq,
                attempt=attempt,
                ts=utcnow(),
                stream="system",
                line=(
                    f"lines 1 to {row.last_seq} of this log were lost: their object (blob "
                    f"{digest}) was missing or damaged, and an operator gave them up; an "
                    "agent run's transcript and tool calls were kept in it too"
                ),
            )
        )
        s.delete(row)
        s.delete(held)
        s.flush()
        delete_unreferenced_blobs(s, [digest])
    return True


def _targets(engine: Engine, run_ids: list[str] | None, outcome: HeldBackOutcome) -> list[str]:
    """The held-back runs to act on: all, or those of `run_ids` (the others go to
    `outcome.not_held`)."""
    if run_ids is None:
        return [h.run_id for h in all_held_back(engine)]
    if len(run_ids) > MOST_NAMED:
        raise InvalidRequest(
            f"{len(run_ids)} runs named; at most {MOST_NAMED} at once",
            hint="name fewer runs, or none to act on every held-back log",
        )
    wanted = sorted(set(run_ids))
    table = HeldBack.__table__  # type: ignore[attr-defined]
    with read_connection(engine) as c:
        held = set(
            c.execute(
                core_select(table.c.run_id)
                .select_from(_current())
                .where(table.c.run_id.in_(wanted))
            ).scalars()
        )
    outcome.not_held += [r for r in wanted if r not in held]
    return [r for r in wanted if r in held]
