"""Worker state: the JSON value a worker with `state:` keeps between runs, versioned.

A run reads the current version when its attempt starts (a replay, its original's) and may
leave a new state; that is committed in the transaction that records the run's success, as
a compare-and-set on the worker's `state_version`: when another run or an operator wrote the
state since the run read it, nothing is written and the run ends `state_conflict` (or runs
again from the newer state, with `state: {on_conflict: retry}`). A run that does not succeed
writes nothing. An operator reads, sets and restores versions on every surface.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import CursorResult, bindparam, delete, insert, update
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import (
    InvalidRequest,
    NotFound,
    StateConflict,
    StateInvalid,
    StateTooLarge,
    quoted,
)
from floom.hints import act, told
from floom.services.access import secrets as secret_service
from floom.services.access.principal import Principal
from floom.services.workers import versions as workers
from floom.store.db import Writer, session_scope
from floom.store.models import Run, Version, Worker, WorkerState, utcnow
from floom.vocabulary import StateSource

if TYPE_CHECKING:
    from floom.config import Settings
    from floom.manifest.schema import Manifest
    from floom.services.context import Context

SOURCES: Final = tuple(StateSource)
# Versions are 32-bit integers in the store; a larger number names no version.
MAX_VERSION: Final = 2**31 - 1


def limit_of(manifest: Manifest, settings: Settings) -> int:
    """The largest state (bytes of JSON) the worker may keep: its state.max_bytes, never
    more than the server's FLOOM_MAX_STATE_BYTES."""
    asked = manifest.state.max_bytes
    return min(asked, settings.max_state_bytes) if asked else settings.max_state_bytes


def encode(value: Any, *, limit: int, where: str = "state") -> str:
    """`value` as the JSON text to keep; StateTooLarge (naming `where`, the size and the
    limit) or StateInvalid (naming the JSON bound) when it cannot be kept."""
    found = jsonvalues.breach_of(value, where=where)
    if found is not None:
        raise StateInvalid(found.message, hint=jsonvalues.bounds_hint(), details=[found.detail()])
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > limit:
        raise StateTooLarge(
            f"{where} is {size} bytes as JSON; this worker may keep at most {limit}",
            hint="keep less (ids and cursors, not the data itself; store data as artifacts), "
            "or raise state.max_bytes in worker.yml (up to the server's FLOOM_MAX_STATE_BYTES)",
            details=[{"path": where, "limit": "bytes", "max": limit, "size": size}],
        )
    return text


def decode(text: str | None) -> Any:
    """A stored state as a value any surface can show (None when there is none)."""
    return None if text is None else jsonvalues.stored(text)


def value_of(row: WorkerState) -> Any:
    """A kept version's value, to start a run from or to write again; StateInvalid when the
    row cannot be read back (not JSON, over a bound: written by hand or by another program),
    so a run fails naming it and a restore changes nothing."""
    value = jsonvalues.stored(row.state_json)
    if isinstance(value, dict) and jsonvalues.UNREADABLE in value:
        raise StateInvalid(
            f"state version {row.version} of worker '{row.worker_name}' is stored in a form "
            f"floom cannot read: {value[jsonvalues.UNREADABLE]}",
            hint=told(
                "set the state afresh (",
                act("state set", worker=row.worker_name),
                ") or restore another version",
            ),
        )
    return value


# -- what a run reads and writes ---------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """What a run's attempt starts from: the state version (0: none yet), its value, and
    which worker of the name keeps it (`owner`: its row's created_at, None when there is
    none): a run's state is written only into the worker it read it from, never into one
    deployed again under the name after a deletion (commit_from_run)."""

    version: int
    value: Any
    owner: datetime | None


def base_of_run(ctx: Context, *, run: Run) -> Base:
    """The state a run starts from (version 0 and None: no state yet). A replay holding its
    original's base (`state_base` set at creation) starts from that; any other run from
    the worker's current version."""
    with session_scope(ctx.engine) as s:
        current = s.execute(_current_version(), {"name": run.worker_name}).first()
        owner = current[1] if current is not None else None
        if run.replay_of is not None and run.state_base is not None:
            version = run.state_base
        else:
            version = current[0] if current is not None else 0
        if version == 0:
            return Base(0, None, owner)
        row = s.get(WorkerState, (run.worker_name, version))
        if row is None:
            raise NotFound(
                f"state version {version} of worker '{run.worker_name}' is no longer kept",
                hint=f"floom keeps the last {ctx.settings.state_history} versions "
                "(FLOOM_STATE_HISTORY); run the worker afresh",
            )
        return Base(version, value_of(row), owner)


def check_kept(ctx: Context, *, worker_name: str, version: int) -> None:
    """NotFound when a replay's pinned state `version` is no longer kept: refused before the
    replay is queued, since it could not start from it."""
    if version == 0:
        return
    with session_scope(ctx.engine) as s:
        if s.get(WorkerState, (worker_name, version)) is None:
            raise NotFound(
                f"the run started from state version {version} of worker '{worker_name}', "
                "which is no longer kept",
                hint=f"floom keeps the last {ctx.settings.state_history} versions "
                "(FLOOM_STATE_HISTORY); start a new run instead",
            )


def commit_from_run(
    s: Writer,
    *,
    worker_name: str,
    base: int,
    owner: datetime | None,
    state_json: str,
    run_id: str,
    keep: int,
) -> int | None:
    """Write a run's new state as version base + 1 in the caller's transaction (the one that
    records the run's success), if the worker's state is still at `base` and the worker is
    still the one the run read it from (`owner`, Base.owner): the new version, or None when
    another write came first or the worker was deleted (and maybe deployed again) since
    (then nothing is written). The newest `keep` versions stay (FLOOM_STATE_HISTORY);
    older ones go."""
    if owner is None:
        return None  # the worker was gone when the run read its state
    return _write(
        s,
        keep=keep,
        owner=owner,
        worker_name=worker_name,
        base=base,
        state_json=state_json,
        source="run",
        written_by=f"run:{run_id}",
        run_id=run_id,
    )


def _write(
    s: Writer,
    *,
    keep: int,
    worker_name: str,
    base: int,
    state_json: str,
    source: str,
    written_by: str | None,
    run_id: str | None = None,
    restored_from: int | None = None,
    owner: datetime | None = None,
) -> int | None:
    # One UPDATE is the compare-and-set: on PostgreSQL a concurrent writer waits for the row
    # and then finds the version moved, so exactly one of them writes base + 1. A run's
    # write also names the worker it read from (`owner`); an operator's locked the row.
    given = {"worker": worker_name, "base": base, "next": base + 1}
    if owner is None:
        moved = s.execute(_compare_and_set(), given)
    else:
        moved = s.execute(_compare_and_set_owned(), {**given, "owner": owner})
    if cast(CursorResult[Any], moved).rowcount != 1:
        return None
    version = base + 1
    s.execute(
        _insert_version(),
        {
            "worker_name": worker_name,
            "version": version,
            "state_json": state_json,
            "size": len(state_json.encode("utf-8")),
            "source": source,
            "written_by": written_by,
            "run_id": run_id,
            "restored_from": restored_from,
            "created_at": utcnow(),
        },
    )
    if version > keep:
        s.execute(
            delete(WorkerState).where(
                col(WorkerState.worker_name) == worker_name,
                col(WorkerState.version) <= version - keep,
            )
        )
    return version


@lru_cache(maxsize=1)
def _current_version() -> Any:
    table = Worker.__table__  # type: ignore[attr-defined]
    return sql_select(table.c.state_version, table.c.created_at).where(
        table.c.name == bindparam("name")
    )


@lru_cache(maxsize=1)
def _compare_and_set_owned() -> Any:
    table = Worker.__table__  # type: ignore[attr-defined]
    return _compare_and_set().where(
        table.c.created_at == bindparam("owner", type_=table.c.created_at.type)
    )


@lru_cache(maxsize=1)
def _compare_and_set() -> Any:
    table = Worker.__table__  # type: ignore[attr-defined]
    return (
        update(table)
        .where(table.c.name == bindparam("worker"), table.c.state_version == bindparam("base"))
        .values(state_version=bindparam("next"))
    )


@lru_cache(maxsize=1)
def _insert_version() -> Any:
    return insert(WorkerState.__table__)  # type: ignore[attr-defined]


# -- what an operator sees and sets --------------------------------------------------------------


def get_state(
    ctx: Context, *, worker_name: str, version: int | None = None, caller: Principal
) -> tuple[int, WorkerState | None]:
    """The worker's current state version and its row (None for version 0: no state yet);
    with `version`, that version (NotFound when it is not kept). Needs the read scope."""
    caller.require("read")
    current = workers.get_worker(ctx, name=worker_name, caller=caller).state_version
    if version is None:
        if current == 0:
            return 0, None
        version = current
    with session_scope(ctx.engine) as s:
        return current, _version_row(s, worker_name, version)


def list_versions(
    ctx: Context,
    *,
    worker_name: str,
    before: int | None = None,
    limit: int = 50,
    caller: Principal,
) -> tuple[int, list[WorkerState], int | None]:
    """The worker's current version and its kept versions, newest first (a page of `limit`
    below `before`), and the cursor of the next page. Needs the read scope."""
    caller.require("read")
    if not 1 <= limit <= 500:
        raise InvalidRequest("limit must be between 1 and 500", hint="use the cursor to page")
    worker = workers.get_worker(ctx, name=worker_name, caller=caller)
    q = (
        select(WorkerState)
        .where(WorkerState.worker_name == worker_name)
        .order_by(col(WorkerState.version).desc())
        .limit(limit + 1)
    )
    if before is not None:
        q = q.where(col(WorkerState.version) < min(before, MAX_VERSION + 1))
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(q).all())
    cursor = rows[limit - 1].version if len(rows) > limit else None
    return worker.state_version, rows[:limit], cursor


def set_state(
    ctx: Context,
    *,
    worker_name: str,
    state: Any = None,
    from_version: int | None = None,
    if_version: int | None = None,
    caller: Principal,
) -> WorkerState:
    """Write a new state version: `state`, or (with `from_version`) the value of that kept
    version again, as a restore. With `if_version`, only while the current version is that
    one (StateConflict otherwise), else over whatever is current. Secret values the worker
    declares are masked, as in a run's outputs. Nothing is written when anything is wrong.
    Needs the deploy scope (checked again in the writing transaction)."""
    caller.require("deploy")
    worker = workers.get_worker(ctx, name=worker_name, caller=caller)
    manifest = _active_manifest(ctx, worker, caller)
    limit = limit_of(manifest, ctx.settings) if manifest else ctx.settings.max_state_bytes
    restored_from = None
    if from_version is not None:
        with session_scope(ctx.engine) as s:
            state = value_of(_version_row(s, worker_name, from_version))
        restored_from = from_version
    if manifest is not None:
        names = [*manifest.secrets, *manifest.apply_secrets]
        values, _ = secret_service.resolve(ctx, names)
        state = secret_service.Redactor(values.values()).value(state)
    text = encode(state, limit=limit)
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")  # a key revoked meanwhile writes nothing
        row = s.get(Worker, worker_name, with_for_update=True)
        if row is None:
            raise NotFound(
                f"no worker named '{quoted(worker_name)}'", hint=told(act("workers"), " lists them")
            )
        base = row.state_version
        if if_version is not None and if_version != base:
            raise _conflict(worker_name, expected=if_version, found=base)
        version = _write(
            s,
            keep=ctx.settings.state_history,
            worker_name=worker_name,
            base=base,
            state_json=text,
            source="restore" if restored_from is not None else "operator",
            written_by=caller.actor or caller.describe(),
            restored_from=restored_from,
        )
        if version is None:  # not on PostgreSQL under the row lock, nor on SQLite
            raise _conflict(worker_name, expected=base, found=None)
        return _version_row(s, worker_name, version)


def rollback_with_state(
    ctx: Context,
    *,
    name: str,
    version_id: str | None = None,
    run_id: str | None = None,
    state_version: int,
    caller: Principal,
) -> workers.Rollback:
    """workers.rollback, and in its transaction the worker's state set to the value of the
    kept `state_version` again (a restore): both or neither. Needs the deploy scope."""

    def restore(s: Session, version: Version) -> None:
        row = _version_row(s, name, state_version)
        limit = limit_of(workers.manifest_of(version), ctx.settings)
        # Kept versions were masked when written; the version made active may keep less.
        text = encode(value_of(row), limit=limit)
        worker = s.get(Worker, name, with_for_update=True)
        base = worker.state_version if worker is not None else 0
        written = _write(
            s,
            keep=ctx.settings.state_history,
            worker_name=name,
            base=base,
            state_json=text,
            source="restore",
            written_by=caller.actor or caller.describe(),
            restored_from=state_version,
        )
        if written is None:
            raise _conflict(name, expected=base, found=None)

    return workers.rollback(
        ctx, name=name, version_id=version_id, run_id=run_id, caller=caller, in_transaction=restore
    )


def _active_manifest(ctx: Context, worker: Worker, caller: Principal) -> Manifest | None:
    if worker.active_version_id is None:
        return None
    version = workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
    return workers.manifest_of(version)


def _version_row(s: Session, worker_name: str, version: int) -> WorkerState:
    row = s.get(WorkerState, (worker_name, version)) if 1 <= version <= MAX_VERSION else None
    if row is None:
        raise NotFound(
            f"worker '{worker_name}' has no state version {version}",
            hint=told(act("state history", worker=worker_name), " lists the versions kept"),
        )
    return row


def _conflict(worker_name: str, *, expected: int, found: int | None) -> StateConflict:
    now = f" is now at version {found}" if found is not None else " changed meanwhile"
    return StateConflict(
        f"the state of worker '{worker_name}'{now}, not {expected}; nothing was written",
        hint=told(
            "read it again with ", act("state get", worker=worker_name), " and set it from there"
        ),
        details=[{"path": "if_version", "expected": expected, "found": found}],
    )
