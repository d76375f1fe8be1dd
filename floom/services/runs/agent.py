"""The records of agent runs: tool calls, transcripts, worker memory, model spend, and the
artifacts a paused run keeps. Callers pass values already redacted."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, delete, exists, func, or_, update
from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import Conflict, LimitExceeded
from floom.services.access.principal import Principal
from floom.services.runs.rules import FINISHED, RUNNING
from floom.services.workers.versions import lock_worker
from floom.store.agents import MemoryEntry, ToolCall, Transcript
from floom.store.blobs.base import missing
from floom.store.blobs.logs import CALL_FIELDS, call_values, decode_record
from floom.store.blobs.rows import StagedBlob, insert_blob, read_blob, read_blob_row, stage_blob
from floom.store.blobs.tables import RunLog
from floom.store.db import session_scope, write_connection
from floom.store.models import Artifact, Blob, Run, new_id, trusted_row, utcnow
from floom.vocabulary import ToolCallStatus

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.services.context import Context

RESULT_CAP = 16 * 1024
MEMORY_VALUE_CAP = 64 * 1024


# -- artifacts of a paused run ----------------------------------------------------------------


StagedArtifact = tuple[str, StagedBlob, str]


def stage_artifacts(
    ctx: Context, artifacts: Sequence[tuple[str, bytes, str]]
) -> list[StagedArtifact]:
    """(name, bytes, content type) made durable as blobs, before the transaction that
    records them (rows.stage_blob)."""
    return [
        (name, stage_blob(ctx.settings, ctx.engine, data), content_type)
        for name, data, content_type in artifacts
    ]


def replace_artifacts(s: Session, *, run_id: str, artifacts: Sequence[StagedArtifact]) -> None:
    """Make `artifacts` the run's artifacts, inside the caller's write session."""
    for old in s.exec(select(Artifact).where(Artifact.run_id == run_id)).all():
        s.delete(old)
    s.flush()
    for name, blob, content_type in artifacts:
        digest = insert_blob(s, blob)
        s.add(
            Artifact(
                run_id=run_id, name=name, size=blob.size, digest=digest, content_type=content_type
            )
        )


def paused_artifacts(ctx: Context, *, run_id: str) -> list[tuple[str, bytes]]:
    """The artifacts a run stored when it paused (name, content), for its next attempt to
    write back into its new output directory."""
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Artifact.name, Artifact.digest)
            .where(Artifact.run_id == run_id)
            .order_by(col(Artifact.name))
        ).all()
    return [
        (
            name,
            read_blob(ctx.settings, ctx.engine, digest, what=f"artifact '{name}' of run {run_id}"),
        )
        for name, digest in rows
    ]


def put_blob(ctx: Context, data: bytes) -> str:
    blob = stage_blob(ctx.settings, ctx.engine, data)
    with session_scope(ctx.engine, write=True) as s:
        return insert_blob(s, blob)


def get_blob(ctx: Context, digest: str, *, what: str) -> bytes | None:
    """The bytes of blob `digest`; None when no such blob was ever stored (or it was
    reclaimed). Damaged or unreachable bytes raise, as rows.read_blob says."""
    with session_scope(ctx.engine) as s:
        if s.get(Blob, digest) is None:
            return None
    return read_blob(ctx.settings, ctx.engine, digest, what=what)


# -- tool calls -------------------------------------------------------------------------------


def _cap(text: str | None) -> str | None:
    if text is None or len(text) <= RESULT_CAP:
        return text
    return text[:RESULT_CAP] + f"... [{len(text) - RESULT_CAP} more characters not stored]"


def record_tool_call(
    ctx: Context,
    *,
    run_id: str,
    attempt: int,
    tool: str,
    arguments: Any,
    status: ToolCallStatus,
    result: str | None = None,
    error: str | None = None,
    duration_ms: int = 0,
    approval_id: str | None = None,
    call_id: str | None = None,
) -> ToolCall | None:
    """Store one tool call after the run's last one (its seq orders the calls); the call as
    stored. A call of a run whose record moved into its log's blob (a stopped attempt's late
    write) is dropped (None), as its transcript save is: its seq would restart at 1, beside
    the blob's calls."""
    with session_scope(ctx.engine, write=True) as s:
        # One statement, so one snapshot: the last seq is read from the calls as they were
        # when the record was, or was not yet, archived. A call whose seq was read before the
        # move stays a row, and list_tool_calls merges it with the blob's.
        last, archived = s.exec(
            select(
                func.max(ToolCall.seq),
                _is_archived(run_id),
            ).where(ToolCall.run_id == run_id)
        ).one()
        call = ToolCall(
            id=call_id or new_id("tc"),
            run_id=run_id,
            seq=int(last or 0) + 1,
            attempt=attempt,
            tool=tool,
            status=status,
            arguments_json=jsonvalues.dumps(arguments, where="arguments"),
            result=_cap(result),
            result_size=len(result or ""),
            error=_cap(error),
            duration_ms=duration_ms,
            approval_id=approval_id,
        )
        if archived:
            return None
        s.add(call)
    return call


def _is_archived(run_id: str) -> Any:
    return (
        select(Transcript.run_id)
        .where(Transcript.run_id == run_id, col(Transcript.archived).is_(True))
        .exists()
    )


def finish_tool_call(
    ctx: Context,
    *,
    call_id: str,
    status: ToolCallStatus,
    arguments: Any,
    result: str | None = None,
    error: str | None = None,
    duration_ms: int = 0,
) -> None:
    """Complete a call that waited for approval, with the arguments it finally ran with."""
    with session_scope(ctx.engine, write=True) as s:
        call = s.get(ToolCall, call_id)
        if call is None:
            return
        call.status = status
        call.arguments_json = jsonvalues.dumps(arguments, where="arguments")
        call.result = _cap(result)
        call.result_size = len(result or "")
        call.error = _cap(error)
        call.duration_ms = duration_ms
        s.add(call)


def list_tool_calls(ctx: Context, *, run_id: str, caller: Principal) -> list[ToolCall]:
    """An agent run's tool calls in order, read from its log's blob when they moved there
    with the run's transcript (archive_record). Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        rows = list(
            s.exec(select(ToolCall).where(ToolCall.run_id == run_id).order_by(col(ToolCall.seq)))
        )
        # Archived or not, where to, and that blob's row, in one read.
        archived = s.execute(
            core_select(
                col(RunLog.digest),
                col(Blob.location),
                col(Blob.sha256),
                col(Blob.data),
                col(Blob.size),
            )
            .select_from(Transcript)
            .outerjoin(RunLog, col(RunLog.run_id) == col(Transcript.run_id))
            .outerjoin(Blob, col(Blob.digest) == col(RunLog.digest))
            .where(col(Transcript.run_id) == run_id, col(Transcript.archived).is_(True))
        ).first()
    if archived is None:
        return rows
    record = _archived_record(
        ctx, run_id, digest=archived[0], blob=tuple(archived[1:]) if archived[0] else None
    )
    moved = [_call_of(run_id, c) for c in record.get("tool_calls", [])]
    # Rows beside an archived record: calls recorded while the record moved (recorded after
    # it, they are dropped), or a moved call that another pass's blob does not hold.
    held = {c.id for c in moved}
    return sorted(moved + [c for c in rows if c.id not in held], key=lambda c: c.seq)


# -- transcripts ------------------------------------------------------------------------------


def load_transcript(
    ctx: Context, *, run_id: str, caller: Principal, text: bool = True
) -> Transcript | None:
    """An agent run's transcript (None for a script's run), its text read from its log's
    blob when it moved there (archive_record); with `text` False, the row as it is (an
    archived one without its text: for its usage figures). Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        found = s.get(Transcript, run_id)
    if found is None or not found.archived or not text:
        return found
    record = _archived_record(ctx, run_id)
    values = found.model_dump()
    values.update(
        system=record["system"],
        messages_json=record["messages_json"],
        state_json=record["state_json"],
        archived=False,  # this copy holds its text
    )
    return Transcript.model_validate(values)


def save_transcript(ctx: Context, transcript: Transcript) -> bool:
    """Write the loop's copy (its row made or replaced), unless the run's record moved into
    object storage already: one statement, whose row count tells which (on every step of an
    agent run, so no read of the row before it). Whether it wrote."""
    transcript.updated_at = utcnow()
    postgres = ctx.engine.dialect.name == "postgresql"
    with write_connection(ctx.engine) as conn:
        # Not written (archived): the run ended and its record moved to object storage; a
        # late write of a stopped attempt is dropped, as its fenced writes are.
        return conn.execute(_upsert_transcript(postgres), transcript.model_dump()).rowcount > 0


@lru_cache(maxsize=2)
def _upsert_transcript(postgres: bool) -> Any:
    """INSERT a transcript row, or replace the run's row unless it is archived (its text in
    its log's object: only the end archives a row, so a save leaves the flag alone)."""
    table = Transcript.__table__  # type: ignore[attr-defined]
    if postgres:
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    stmt = insert(table)
    kept = ("run_id", "archived")
    # preserve_rowcount: an INSERT's row count is otherwise not kept (PostgreSQL's is -1).
    return stmt.on_conflict_do_update(
        index_elements=["run_id"],
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in kept},
        where=table.c.archived.is_(False),
    ).execution_options(preserve_rowcount=True)


# -- an ended agent run's record in object storage ---------------------------------------------


def archive_record(transcript: Transcript, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """What of an ended agent run moves into its log's blob (floom/store/blobs/logs.py): the
    transcript's text, as stored (already redacted), and its tool calls."""
    return {
        "system": transcript.system,
        "messages_json": transcript.messages_json,
        "state_json": transcript.state_json,
        "tool_calls": [
            {**{f: getattr(c, f) for f in CALL_FIELDS}, "created_at": c.created_at.isoformat()}
            for c in calls
        ],
    }


def record_archived(s: Session, moved: Sequence[tuple[Transcript, Sequence[str]]]) -> None:
    """In the transaction that records the blobs holding their records (services/ops/objects.py):
    empty the transcripts' text and drop their tool calls. A transcript written since it was
    read keeps its text, and its calls their rows (the blob's copy is then not read)."""
    emptied = {run_id for (run_id,) in s.execute(_emptied(moved)).all()}
    calls = [c for t, ids in moved if t.run_id in emptied for c in ids]
    if calls:
        s.execute(delete(ToolCall).where(col(ToolCall.id).in_(calls)))


def record_archived_ctes(moved: Sequence[tuple[Transcript, Sequence[str]]]) -> list[Any]:
    """record_archived's two statements as CTEs of one PostgreSQL statement. For one run
    (a run's end) the plain form: its figures set as values, its calls found by its run id
    and deleted if its transcript was emptied; a CASE per figure and a join of the calls to
    the emptied runs are for batches (the upload loop's), and cost a run's end PostgreSQL
    about 40 us more to plan and run (bench/README.md, 6 December evening)."""
    if len(moved) == 1:
        ((transcript, ids),) = moved
        emptied = _emptied_one(transcript).cte("emptied")
        ctes: list[Any] = [emptied]
        if ids:
            ctes.append(
                delete(ToolCall)
                .where(
                    col(ToolCall.run_id) == transcript.run_id,
                    col(ToolCall.id).in_(list(ids)),
                    exists(select(emptied.c.run_id)),
                )
                .cte("calls_gone")
            )
        return ctes
    emptied = _emptied(moved).cte("emptied")
    calls = [c for _, ids in moved for c in ids]
    ctes = [emptied]
    if calls:
        ctes.append(
            delete(ToolCall)
            .where(
                col(ToolCall.id).in_(calls),
                col(ToolCall.run_id).in_(select(emptied.c.run_id)),
            )
            .cte("calls_gone")
        )
    return ctes


# What an archived transcript row keeps, written from the copy whose text moved: an agent
# run's loop leaves its last step unsaved (floom/agent/loop.py), so its end's statement is
# the row's only write of that step's figures.
KEPT_FIGURES = (
    "iterations",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "active_seconds",
    "workspace_digest",
)


def _emptied(moved: Sequence[tuple[Transcript, Sequence[str]]]) -> Any:
    """The transcripts, unchanged since read, emptied and marked archived, with the figures
    of the copies read; their run ids."""
    figures = {
        name: case(
            {t.run_id: getattr(t, name) for t, _ in moved},
            value=col(Transcript.run_id),
            else_=getattr(Transcript, name),
        )
        for name in KEPT_FIGURES
    }
    return (
        update(Transcript)
        .where(
            or_(
                *(
                    (col(Transcript.run_id) == t.run_id)
                    & (col(Transcript.updated_at) == t.updated_at)
                    for t, _ in moved
                )
            ),
            col(Transcript.archived).is_(False),
        )
        .values(system="", messages_json="", state_json="", archived=True, **figures)
        .returning(col(Transcript.run_id))
    )


def _emptied_one(t: Transcript) -> Any:
    """_emptied for one run's transcript."""
    return (
        update(Transcript)
        .where(
            col(Transcript.run_id) == t.run_id,
            col(Transcript.updated_at) == t.updated_at,
            col(Transcript.archived).is_(False),
        )
        .values(
            system="",
            messages_json="",
            state_json="",
            archived=True,
            **{name: getattr(t, name) for name in KEPT_FIGURES},
        )
        .returning(col(Transcript.run_id))
    )


def _log_digest(run_id: str) -> Any:
    return select(RunLog.digest).where(RunLog.run_id == run_id).scalar_subquery()


def _archived_record(
    ctx: Context, run_id: str, *, digest: str | None = None, blob: tuple[Any, ...] | None = None
) -> dict[str, Any]:
    """The record of an agent run that moved into its log's blob (`digest`, when the caller
    read it already)."""
    what = f"the transcript of run {run_id}"
    if digest is None:
        with session_scope(ctx.engine) as s:
            archived = s.get(RunLog, run_id)
        if archived is None:
            raise missing(what=what, where=f"the log of run {run_id} (no row in run_logs)")
        digest = archived.digest
    if blob is not None:  # its row read with the digest (list_tool_calls)
        data = read_blob_row(ctx.settings, ctx.engine, digest, blob, what=what)
    else:
        data = read_blob(ctx.settings, ctx.engine, digest, what=what)
    record = decode_record(run_id, digest, data)
    if record is None:
        raise missing(what=what, where=f"the log blob {digest} of run {run_id}")
    return record


def _call_of(run_id: str, kept: dict[str, Any]) -> ToolCall:
    return trusted_row(ToolCall, call_values(run_id, kept))


# -- model spend ------------------------------------------------------------------------------


def month_bounds(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The start of this UTC calendar month and of the next, when monthly caps reset."""
    now = (now or utcnow()).astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, nxt


def month_cost(ctx: Context, *, worker_name: str) -> float:
    start, _ = month_bounds()
    with session_scope(ctx.engine) as s:
        total = s.exec(
            select(func.sum(Transcript.cost_usd)).where(
                Transcript.worker_name == worker_name, col(Transcript.created_at) >= start
            )
        ).one()
    return float(total or 0.0)


def check_monthly_cap(ctx: Context, *, worker_name: str, manifest: Manifest) -> None:
    """Refuse a new run of an agent worker whose model spend this month reached its cap."""
    cap = manifest.limits.monthly_cost_usd
    if manifest.kind != "agent" or cap is None:
        return
    spent = month_cost(ctx, worker_name=worker_name)
    if spent >= cap:
        _, reset = month_bounds()
        raise LimitExceeded(
            f"worker '{worker_name}' has spent ${spent:.2f} of its ${cap:.2f} monthly model "
            f"budget (limits.monthly_cost_usd); it resets on {reset:%Y-%m-%d} 00:00 UTC",
            hint="raise limits.monthly_cost_usd in worker.yml and deploy, or wait for the reset",
            details={
                "limit": "monthly_cost_usd",
                "spent_usd": round(spent, 4),
                "resets_at": reset.isoformat(),
            },
        )


# -- memory -----------------------------------------------------------------------------------


def _check_memory_user(s: Any, *, run_id: str, lease_epoch: int, worker_name: str) -> None:
    """Conflict unless `run_id` is a run of `worker_name` that is still running under the
    attempt that holds `lease_epoch` (the fencing token its claim gave it) and not asked to
    stop. A worker's memory is its running runs': a deletion asks every running run of the
    worker to stop before it deletes the memory, so a run of a deleted worker, still running
    until it sees that, neither writes into nor reads the memory of a worker deployed again
    under the name; and an attempt whose lease was lost (its node frozen or cut off, the run
    reaped and maybe running again elsewhere) is fenced here as its end is."""
    row = s.execute(
        core_select(
            col(Run.worker_name), col(Run.status), col(Run.cancel_requested), col(Run.lease_epoch)
        ).where(col(Run.id) == run_id)
    ).first()
    if row is None or row.worker_name != worker_name:
        raise Conflict(
            f"run {run_id} is not a run of worker '{worker_name}'",
            hint="a run reads and writes its own worker's memory only",
        )
    if row.cancel_requested or row.status in FINISHED:
        raise Conflict(
            f"run {run_id} is being stopped (cancelled, or its worker deleted): it no longer "
            f"reads or writes the memory of worker '{worker_name}'",
            hint="finish without it",
        )
    if row.status != RUNNING or row.lease_epoch != lease_epoch:
        raise Conflict(
            f"this attempt of run {run_id} no longer holds its lease (the run was taken over "
            f"after its lease expired): it no longer reads or writes the memory of worker "
            f"'{worker_name}'",
            hint="finish without it; the attempt that holds the run now goes on",
        )


def remember(
    ctx: Context, *, worker_name: str, key: str, value: Any, run_id: str, lease_epoch: int
) -> None:
    """Store `value` under `key` in the worker's memory, for `run_id` (a running run of it:
    _check_memory_user). The worker's row is share-locked first, so a deletion committing
    meanwhile either deletes this entry with the rest or is seen here."""
    with session_scope(ctx.engine, write=True) as s:
        lock_worker(s, worker_name)
        _check_memory_user(s, run_id=run_id, lease_epoch=lease_epoch, worker_name=worker_name)
        s.add(
            MemoryEntry(
                worker_name=worker_name,
                key=key,
                value_json=jsonvalues.dumps(value, where="value"),
                run_id=run_id,
            )
        )


def recall(
    ctx: Context, *, worker_name: str, key: str, run_id: str, lease_epoch: int
) -> tuple[Any, str | None]:
    """The newest value stored under key, and the run that wrote it (None, None if never),
    for `run_id` (a running run of the worker: _check_memory_user)."""
    with session_scope(ctx.engine) as s:
        _check_memory_user(s, run_id=run_id, lease_epoch=lease_epoch, worker_name=worker_name)
        row = s.exec(
            select(MemoryEntry)
            .where(MemoryEntry.worker_name == worker_name, MemoryEntry.key == key)
            .order_by(col(MemoryEntry.id).desc())
            .limit(1)
        ).first()
    return (jsonvalues.stored(row.value_json), row.run_id) if row else (None, None)


def memory_keys(
    ctx: Context, *, worker_name: str, run_id: str, lease_epoch: int, limit: int = 100
) -> list[str]:
    with session_scope(ctx.engine) as s:
        _check_memory_user(s, run_id=run_id, lease_epoch=lease_epoch, worker_name=worker_name)
        rows = s.exec(
            select(MemoryEntry.key)
            .where(MemoryEntry.worker_name == worker_name)
            .group_by(MemoryEntry.key)
            .order_by(MemoryEntry.key)
            .limit(limit)
        ).all()
    return list(rows)


def memory_writes(ctx: Context, *, worker_name: str) -> list[dict[str, Any]]:
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(MemoryEntry)
            .where(MemoryEntry.worker_name == worker_name)
            .order_by(col(MemoryEntry.id))
        ).all()
    return [
        {
            "key": r.key,
            "value": jsonvalues.stored(r.value_json),
            "run_id": r.run_id,
            "created_at": r.created_at,
        }
        for r in rows
    ]
