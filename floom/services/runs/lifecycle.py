"""Runs: creating them (the queue's producer side), reading, cancelling and replaying."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import bindparam, insert, or_
from sqlalchemy import select as sql_select
from sqlalchemy.orm import make_transient_to_detached
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import (
    Conflict,
    FloomError,
    InputInvalid,
    InputsTooLarge,
    InvalidRequest,
    NotFound,
    RunErrorCode,
    WorkerPaused,
    quoted,
)
from floom.hints import act, told
from floom.services import paging
from floom.services.access.principal import Principal
from floom.services.ops import nodes
from floom.services.runs import agent as agent_runs
from floom.services.runs import approvals, artifact_scan
from floom.services.runs.logs import append_events, system_event
from floom.services.runs.rules import (
    AWAITING_APPROVAL,
    CALLER,
    CANCELLED,
    FINISHED,
    QUEUED,
    RUNNING,
    SKIPPED,
    STATUSES,
    kept_error,
    mark_claimed,
    started_message,
    transition,
)
from floom.services.workers import exposure
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.store import group_commit, signals
from floom.store.blobs.rows import read_blob
from floom.store.db import Reader, Writer, database_clock, session_scope
from floom.store.models import (
    Artifact,
    Run,
    RunEvent,
    Version,
    Worker,
    new_id,
    trusted_row,
    utcnow,
)
from floom.store.statements import hot
from floom.vocabulary import RunTrigger

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.services.context import Context

TRIGGERS: tuple[RunTrigger, ...] = tuple(RunTrigger)


def create_run(
    ctx: Context,
    *,
    worker_name: str,
    inputs: Mapping[str, Any] | None = None,
    coerce_strings: bool = False,
    trigger: RunTrigger = RunTrigger.API,
    caller: Principal,
    version_id: str | None = None,
    replay_of: str | None = None,
    scheduled_for: datetime | None = None,
    force: bool = False,
    in_transaction: Callable[[Session, Run], None] | None = None,
    parent_run_id: str | None = None,
    from_recording: bool = False,
    recording_acts: bool = False,
    state_base: int | None = None,
) -> Run:
    """Validate the inputs against the version's manifest and queue a run.

    Bad inputs raise InputInvalid and create nothing. The run is pinned to `version_id`,
    or to the worker's active version. A caller on a surface the worker's active manifest
    does not `expose` is refused (NotExposed; floom's own triggers never are, nor is a
    replay `from_recording`, which acts on nothing). A version other than the active one,
    or `force` on a paused worker, needs the deploy scope (exposure.check_deploy_choices).
    A replay from a recording that `recording_acts` (calls tools live: its version's
    replay.live_tools) acts as a run does: both rules hold for it. A paused worker refuses
    runs (WorkerPaused) unless `force`. `in_transaction` runs in the transaction that
    inserts the run, so a trigger can record its fire or delivery atomically with it; what
    it raises undoes the run. A replay's `state_base` is the worker state version its original
    started from, and it starts from that one too. Needs the run scope.
    """
    caller.require("run")
    if trigger not in TRIGGERS:
        raise InvalidRequest(
            f"unknown trigger '{quoted(trigger)}'", hint=f"one of {', '.join(TRIGGERS)}"
        )
    _check_input_bounds(inputs, max_bytes=ctx.settings.max_input_bytes)
    # First from this process's copy of the worker, which the queueing transaction checks
    # against the row it locks anyway; a stale copy costs one more pass, read afresh.
    for cached in (True, False):
        worker = (
            workers.cached_worker(ctx, name=worker_name)
            if cached
            else workers.get_worker(ctx, name=worker_name, caller=caller)
        )
        try:
            run, locked = _queue_run(
                ctx,
                worker=worker,
                check_against_lock=cached,
                inputs=inputs,
                coerce_strings=coerce_strings,
                trigger=trigger,
                caller=caller,
                acts=recording_acts or not from_recording,
                recording=from_recording,
                version_id=version_id,
                replay_of=replay_of,
                scheduled_for=scheduled_for,
                force=force,
                in_transaction=in_transaction,
                parent_run_id=parent_run_id,
                state_base=state_base,
            )
        except (_StaleWorker, FloomError):
            # From a stale copy a refusal (paused, no such version) may be wrong too: decide
            # again from the store, where the answer stands.
            workers.forget_worker(ctx, name=worker_name)
            if not cached:
                raise
            continue
        workers.remember_worker(ctx, locked)
        break
    if run.status == QUEUED:  # not taken by this node in the queueing transaction
        ctx.node.run_queued()
    return run


class _StaleWorker(Exception):
    """This process's copy of a worker differs from the row the queueing transaction locked."""


def _queue_run(
    ctx: Context,
    *,
    worker: Worker,
    check_against_lock: bool,
    inputs: Mapping[str, Any] | None,
    coerce_strings: bool,
    trigger: RunTrigger,
    caller: Principal,
    acts: bool,
    recording: bool,
    version_id: str | None,
    replay_of: str | None,
    scheduled_for: datetime | None,
    force: bool,
    in_transaction: Callable[[Session, Run], None] | None,
    parent_run_id: str | None,
    state_base: int | None,
) -> tuple[Run, Worker]:
    """create_run's checks and insert for `worker`; raises _StaleWorker when
    `check_against_lock` and the locked row says otherwise."""
    version, manifest = _runnable_version(
        ctx,
        worker=worker,
        version_id=version_id,
        caller=caller,
        acts=acts,
        recording=recording,
        force=force,
        replay_of=replay_of,
    )
    clean = manifest.coerce_inputs(dict(inputs or {}), from_strings=coerce_strings)
    if replay_of and state_base:
        worker_state.check_kept(ctx, worker_name=worker.name, version=state_base)
    run = trusted_row(
        Run,
        {
            "id": new_id("run"),
            "worker_name": worker.name,
            "version_id": version.id,
            "status": QUEUED,
            "trigger": trigger,
            "inputs_json": json.dumps(clean),
            "max_attempts": manifest.retries.count + 1,
            "concurrency": manifest.concurrency,
            "replay_of": replay_of,
            "scheduled_for": scheduled_for,
            "created_by": caller.actor,
            "parent_run_id": parent_run_id,
            "state_base": state_base if replay_of else None,
        },
    )
    # A free slot of this node's executor takes the run in this very transaction (an agent's
    # child run is claimed by its agent; a limited worker's run waits for the queue's count).
    # Its sandbox starts while the transaction commits, unless a trigger's step may still
    # limit the run.
    slot = (
        ctx.node.slot_for(run, version, start_ahead=in_transaction is None)
        if parent_run_id is None and run.concurrency is None
        else nullcontext(False)
    )
    with slot as held:
        locked = _insert_queued(
            ctx,
            run=run,
            worker=worker,
            check_against_lock=check_against_lock,
            held=held,
            in_transaction=in_transaction,
            caller=caller,
            force=force,
            check_choices=acts,
            recording=recording,
        )
    return run, locked


def _runnable_version(
    ctx: Context,
    *,
    worker: Worker,
    version_id: str | None,
    caller: Principal,
    acts: bool,
    recording: bool,
    force: bool,
    replay_of: str | None,
) -> tuple[Version, Manifest]:
    """The version a new run of `worker` runs (`version_id`, or the active one) with its
    manifest, once the worker may run: when the run `acts` (all but a replay from a
    recording that calls no tool live), exposed to `caller` and, on a version other than
    the active one or forced, started by a caller with the deploy scope; not paused (unless
    `force`), and under its monthly cap."""
    version_id = version_id or worker.active_version_id
    if version_id is None:
        raise Conflict(
            f"worker '{worker.name}' has no active version",
            hint=told(
                "deploy it with ",
                act("deploy"),
                " or ",
                act("rollback", worker=worker.name, version="VERSION"),
            ),
        )
    version = workers.get_version(
        ctx, version_id=version_id, worker_name=worker.name, caller=caller
    )
    manifest = workers.manifest_of(version)
    if acts:
        check_exposed_now(ctx, worker=worker, version=version, manifest=manifest, caller=caller)
        exposure.check_deploy_choices(
            worker,
            version_id=version.id,
            force=force,
            replay_of=replay_of,
            caller=caller,
            recording=recording,
        )
    if worker.paused and not force:
        raise WorkerPaused(
            f"worker '{worker.name}' is paused",
            hint=told(
                "resume it with ",
                act("resume", worker=worker.name),
                ", or run it anyway with ",
                act("run", worker=worker.name, force=True),
            ),
        )
    agent_runs.check_monthly_cap(ctx, worker_name=worker.name, manifest=manifest)
    return version, manifest


def check_exposed_now(
    ctx: Context, *, worker: Worker, version: Version, manifest: Manifest, caller: Principal
) -> None:
    """Raise NotExposed unless `caller`'s surface may start `worker` by what its active
    version's `expose` says now, even for a run of `version` (whose `manifest` is given)."""
    current = manifest
    if worker.active_version_id not in (None, version.id):
        active = workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
        current = workers.manifest_of(active)
    exposure.check_exposed(current, worker=worker.name, caller=caller)


def _insert_queued(
    ctx: Context,
    *,
    run: Run,
    worker: Worker,
    check_against_lock: bool,
    held: bool,
    in_transaction: Callable[[Session, Run], None] | None,
    caller: Principal,
    force: bool,
    check_choices: bool,
    recording: bool,
) -> Worker:
    """The queueing transaction: insert `run` with its first lines, as claimed by this node
    when a slot is `held` for it and no older run may start first, and with the trigger's
    step `in_transaction`. With `check_choices`, a version other than the active one or a
    forced run of a paused worker is decided again from the locked row (a rollback or pause
    since the first check). Returns the worker's row as locked.

    Without a trigger's step, every statement is Core and a plain connection does; on SQLite
    runs queued at the same moment then share one write transaction (store.group_commit),
    each under a savepoint of its own, so that a burst's queueings take the write lock once
    together, not once each; every check here holds for each run as it would alone."""

    def queue(s: Writer) -> Worker:
        # A deletion since the checks above wins, even over this process's cached version.
        locked = workers.lock_worker(s, worker.name, version_id=run.version_id)
        if check_against_lock and (locked.paused, locked.active_version_id) != (
            worker.paused,
            worker.active_version_id,
        ):
            raise _StaleWorker
        if check_choices:
            exposure.check_deploy_choices(
                locked,
                version_id=run.version_id,
                force=force,
                replay_of=run.replay_of,
                caller=caller,
                s=s,
                recording=recording,
            )
        note = f"queued ({run.trigger}) on version {run.version_id}"
        if run.replay_of:
            note += f", replay of {run.replay_of}"
        notes: list[tuple[str, str, datetime | None]] = [("system", note, None)]
        # Never ahead of a run queued before it: then this one queues behind it.
        take = held and ANY_RUNNABLE.first(s, {"now": database_clock(ctx.engine).now()}) is None
        if not held and not nodes.executor_live(ctx, s):
            notes.append(("system", nodes.QUEUED_WITHOUT_EXECUTOR, None))
        if take and in_transaction is None:
            _claim_here(ctx, run)  # inserted as claimed: no UPDATE after
            notes.append(_started_note(ctx, run))
        # Stamped here, so that the copy the attempt keeps of them is what is stored.
        stamped = utcnow()
        notes = [(stream, line, stamped) for stream, line, _ in notes]
        _insert_run(s, run, attach=in_transaction is not None)
        append_events(s, run_id=run.id, attempt=1, lines=notes, first=True)
        if in_transaction is not None:
            in_transaction(cast(Session, s), run)  # a session: see below
            # The trigger's step may have limited the run (a schedule that queues
            # overlapping runs): only then is it known whether it may start here.
            if take and run.concurrency is None:
                _claim_here(ctx, run)  # written with the step's own changes at commit
                started = _started_note(ctx, run)
                notes.append((*started[:2], stamped))
                append_events(s, run_id=run.id, attempt=1, lines=notes[-1:])
        if run.status == QUEUED:
            signals.publish(s, signals.RUN_QUEUED)
        stored[:] = notes
        return locked

    stored: list[tuple[str, str, datetime | None]] = []  # the lines as queue() wrote them
    if in_transaction is None:
        locked = group_commit.write_step(ctx.engine, queue)
    else:
        # A trigger's step adds rows through the ORM: a session of its own.
        with session_scope(ctx.engine, write=True) as s:
            locked = queue(s)
    if run.status == RUNNING and ctx.settings.blob_store != "database":
        # Claimed here, and committed: its attempt keeps a copy of its lines for its end to
        # put into its object (a step that wrote one more makes the copy miss it, which its
        # end's count of the lines refuses).
        ctx.node.lines_stored(
            run.id,
            [
                trusted_row(
                    RunEvent,
                    {
                        "run_id": run.id,
                        "seq": seq,
                        "attempt": 1,
                        "ts": ts,
                        "stream": st,
                        "line": ln,
                    },
                )
                for seq, (st, ln, ts) in enumerate(stored, 1)
            ],
        )
    return locked


def _claim_here(ctx: Context, run: Run) -> None:
    # The lease on the database's clock, as the queue's claim writes it.
    now = database_clock(ctx.engine).now()
    mark_claimed(run, node_id=ctx.node_id, lease_seconds=ctx.settings.lease_seconds, now=now)


def _started_note(ctx: Context, run: Run) -> tuple[str, str, None]:
    return ("system", started_message(run, node_id=ctx.node_id), None)


def _insert_run(s: Writer, run: Run, *, attach: bool) -> None:
    """Insert a run built by trusted_row with one Core statement instead of the unit of work's
    flush. With `attach`, it is then attached to `s` as the stored row it now is: whatever the
    caller's transaction changes on it after this (a trigger's id) is written at commit.
    Without, the session never tracks it (nothing changes it after the insert)."""
    RUN_INSERT.rows(s, {name: run.__dict__[name] for name in _run_columns()})
    make_transient_to_detached(run)
    if attach:
        cast(Session, s).add(run)  # a trigger's step runs in a session


@lru_cache(maxsize=1)
def any_runnable_statement() -> Any:
    """Whether any queued run may start now (the queue's claim would find one): a select of
    one id, with the time as `now`."""
    table = Run.__table__  # type: ignore[attr-defined]
    now = bindparam("now", type_=table.c.not_before.type)
    return (
        sql_select(table.c.id)
        .where(
            table.c.status == QUEUED,
            or_(table.c.not_before.is_(None), table.c.not_before <= now),
        )
        .limit(1)
    )


@lru_cache(maxsize=1)
def _run_insert() -> Any:
    return insert(Run.__table__)  # type: ignore[attr-defined]


@lru_cache(maxsize=1)
def _run_columns() -> tuple[str, ...]:
    return tuple(c.key for c in Run.__table__.c)  # type: ignore[attr-defined]


ANY_RUNNABLE = hot.Statement("runs.any_runnable", any_runnable_statement)
RUN_INSERT = hot.Statement("runs.insert", _run_insert, keys=_run_columns())


def insert_skipped_run(
    s: Session,
    *,
    worker_name: str,
    version_id: str | None,
    trigger: RunTrigger,
    trigger_id: str | None,
    code: RunErrorCode,
    reason: str,
    error_message: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    scheduled_for: datetime | None = None,
    run_id: str | None = None,
) -> Run:
    """A trigger's tick or event that did not become a run, kept as a skipped run saying why
    (`code`, `reason`), so it shows in every run list. Written in the caller's transaction."""
    run = Run(
        id=run_id or new_id("run"),
        worker_name=worker_name,
        version_id=version_id or "",
        status=SKIPPED,
        trigger=trigger,
        trigger_id=trigger_id,
        inputs_json=json.dumps(dict(inputs or {})),
        scheduled_for=scheduled_for,
        finished_at=utcnow(),
        error_code=code,
        error_message=kept_error(error_message or reason),
    )
    s.add(run)
    s.flush()
    system_event(s, run_id=run.id, attempt=1, message=f"skipped: {kept_error(reason)}")
    return run


MAX_INPUT_DEPTH = jsonvalues.MAX_DEPTH


def _check_input_bounds(inputs: Any, *, max_bytes: int) -> None:
    # Before anything is read or stored for the run; the shape first (depth, keys, numbers),
    # so that measuring the size cannot recurse without bound; a long string after the size.
    found = jsonvalues.breach_of(inputs, where="inputs")
    if found is not None and found.limit != "string":
        flatten = "flatten the value, or pass it as a file input; "
        raise InputInvalid(
            found.message,
            hint=(flatten if found.limit in ("depth", "keys") else "") + jsonvalues.bounds_hint(),
            details=[found.detail()],
        )
    size = len(json.dumps(inputs or {}, default=str, ensure_ascii=False).encode("utf-8"))
    if size > max_bytes:
        raise InputsTooLarge(
            f"the inputs are {size} bytes as JSON; this server accepts at most {max_bytes}",
            hint="pass large data as a file input or a URL the worker fetches; the operator "
            "sets FLOOM_MAX_INPUT_BYTES",
            details=[{"path": "inputs", "limit": "bytes", "max": max_bytes}],
        )
    if found is not None:
        raise InputInvalid(found.message, hint=jsonvalues.bounds_hint(), details=[found.detail()])


def get_run(ctx: Context, *, run_id: str, caller: Principal) -> Run:
    """One run; NotFound when there is none. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return run_in_session(s, run_id)


def run_in_session(s: Session, run_id: str) -> Run:
    """The run, read in the caller's session; NotFound when there is none."""
    run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {quoted(run_id)}", hint=told(act("runs"), " lists recent runs"))
    return run


def peek_run(s: Reader, run_id: str) -> Run:
    """The run as stored, read in the caller's session for looking at only: a copy that is
    not attached to `s` (a change to it is not written), built without the ORM's loading
    (~250 us less per read; waits read runs often). NotFound when there is none."""
    row = RUN_BY_ID.first(s, {"id": run_id})
    if row is None:
        raise NotFound(f"no run {quoted(run_id)}", hint=told(act("runs"), " lists recent runs"))
    return trusted_row(Run, row)


@lru_cache(maxsize=1)
def _run_by_id() -> Any:
    runs = Run.__table__  # type: ignore[attr-defined]
    return sql_select(*runs.c).where(runs.c.id == bindparam("id"))


RUN_BY_ID = hot.Statement("runs.by_id", _run_by_id)


def list_runs(
    ctx: Context,
    *,
    worker: str | None = None,
    status: str | None = None,
    trigger: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    caller: Principal,
) -> tuple[list[Run], str | None]:
    """Newest first; `cursor` is the id of the last run of the previous page. Needs the
    read scope."""
    caller.require("read")
    if status and status not in STATUSES:
        raise InvalidRequest(
            f"unknown status '{quoted(status)}'", hint=f"one of {', '.join(STATUSES)}"
        )
    if trigger and trigger not in TRIGGERS:
        # Refused like a status: a misspelt trigger would read as "no such runs".
        raise InvalidRequest(
            f"unknown trigger '{quoted(trigger)}'", hint=f"one of {', '.join(TRIGGERS)}"
        )
    paging.check_limit(limit)
    q = select(Run).order_by(col(Run.id).desc()).limit(limit + 1)
    if worker:
        q = q.where(Run.worker_name == worker)
    if status:
        q = q.where(Run.status == status)
    if trigger:
        q = q.where(Run.trigger == trigger)
    if cursor := paging.id_cursor(cursor, prefix="run"):
        q = q.where(Run.id < cursor)
    if created_after:
        q = q.where(col(Run.created_at) >= created_after)
    if created_before:
        q = q.where(col(Run.created_at) < created_before)
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(q).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor


def cancel_run(ctx: Context, *, run_id: str, caller: Principal) -> Run:
    """A queued run ends at once; a running one is killed by its executor within seconds.
    Needs the run scope."""
    caller.require("run")
    actor = caller.actor
    with session_scope(ctx.engine, write=True) as s:
        run = run_in_session(s, run_id)
        if run.status in FINISHED:
            raise Conflict(
                f"run {run_id} already ended ({run.status})",
                hint="only queued or running runs can be cancelled",
            )
        who = f" by {actor}" if actor else ""
        if run.status == AWAITING_APPROVAL:
            approvals.withdraw_pending(s, run_id=run.id, actor=actor)
        if run.status in (QUEUED, AWAITING_APPROVAL):
            before = "started" if run.status == QUEUED else "was approved"
            transition(
                run,
                CANCELLED,
                by=CALLER,
                error_code=RunErrorCode.CANCELLED,
                error_message=f"cancelled{who} before it {before}",
            )
            system_event(s, run_id=run.id, attempt=run.attempt, message=f"cancelled{who}")
        else:
            run.cancel_requested = True
            system_event(s, run_id=run.id, attempt=run.attempt, message=f"cancel requested{who}")
            signals.publish(s, signals.RUN_CANCEL, run.id)
        s.add(run)
    ctx.node.run_cancelled(run_id)
    return run


def replay_run(
    ctx: Context,
    *,
    run_id: str,
    latest: bool = False,
    caller: Principal,
    trigger: RunTrigger = RunTrigger.REPLAY,
    force: bool = False,
) -> Run:
    """Run again with the same inputs, on the same version unless `latest`. Needs the run
    scope."""
    caller.require("run")
    original = get_run(ctx, run_id=run_id, caller=caller)
    return create_run(
        ctx,
        worker_name=original.worker_name,
        inputs=jsonvalues.stored(original.inputs_json, expect=dict),
        trigger=trigger,
        caller=caller,
        version_id=None if latest else original.version_id,
        replay_of=original.id,
        force=force,
        state_base=original.state_base,
    )


def list_artifacts(ctx: Context, *, run_id: str, caller: Principal) -> list[Artifact]:
    """A run's artifacts by name; NotFound when there is no such run. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        run_in_session(s, run_id)
        return list(
            s.exec(select(Artifact).where(Artifact.run_id == run_id).order_by(Artifact.name)).all()
        )


def read_artifact(
    ctx: Context, *, run_id: str, name: str, caller: Principal
) -> tuple[Artifact, bytes]:
    """One artifact of a run with its bytes. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        run_in_session(s, run_id)
        art = s.exec(
            select(Artifact).where(Artifact.run_id == run_id, Artifact.name == name)
        ).first()
        if art is None:
            raise NotFound(
                f"run {run_id} has no artifact '{quoted(name)}'",
                hint=told(act("runs show", run_id=run_id), " lists its artifacts"),
            )
        artifact_scan.check_may_read(
            name=name, content_type=art.content_type, data=None, reader=caller
        )
    # After the read transaction: the bytes may come from an object store.
    data = read_blob(
        ctx.settings, ctx.engine, art.digest, what=f"artifact '{name}' of run {run_id}"
    )
    artifact_scan.check_may_read(name=name, content_type=art.content_type, data=data, reader=caller)
    return art, data


def version_of_run(ctx: Context, *, run: Run, caller: Principal) -> Version:
    """The version a run ran (kept even after its worker was deleted). Needs the read scope."""
    caller.require("read")
    return workers.get_version(ctx, version_id=run.version_id, caller=caller)
