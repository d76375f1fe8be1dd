"""Workers and their immutable, content-addressed versions: deploy, list, rollback."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam
from sqlalchemy import select as sql_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom.bundle import Bundle, read_archive, read_upload
from floom.errors import Conflict, InvalidRequest, ManifestInvalid, NotFound, quoted
from floom.hints import Told, act, told
from floom.manifest.load import check_manifest, manifest_invalid, parse_manifest
from floom.manifest.schema import MAX_SKILL_BYTES, Manifest, Problem
from floom.sandbox import configuration_problem
from floom.services import paging
from floom.services.access.principal import SYSTEM, Principal
from floom.services.alerts.channels import trigger_callback_problems
from floom.services.triggers.registry import sync_triggers
from floom.services.workers.limit_ceilings import over_ceilings
from floom.store.blobs.rows import insert_blob, read_blob, stage_blob
from floom.store.db import Writer, session_scope
from floom.store.models import Run, Version, Worker, trusted_row, utcnow
from floom.store.statements import hot

if TYPE_CHECKING:
    from floom.services.context import Context


@dataclass(frozen=True)
class DeployResult:
    worker: Worker
    version: Version
    created: bool
    activated: bool
    # What the upload held that no version ships (bundle.read_upload), each with why.
    left_out: tuple[Told, ...] = ()


def _bundle_manifest_text(bundle: Bundle) -> str:
    if "worker.yml" not in bundle.files:
        raise ManifestInvalid(
            "the worker has no worker.yml",
            hint="create worker.yml in the folder with at least `name: my-worker`",
        )
    text, problem = _utf8_text(bundle, "worker.yml")
    if problem is not None:
        raise manifest_invalid([problem])
    return text


def file_problems(manifest: Manifest, bundle: Bundle) -> list[Problem]:
    """A problem for each file of the bundle read whole into floom's memory at run time that
    is over its own bound: an agent's SKILL.md (worker.yml has its own, MAX_MANIFEST_BYTES)."""
    entry = bundle.files.get(manifest.entry)
    if manifest.kind != "agent" or entry is None or len(entry.data) <= MAX_SKILL_BYTES:
        return []
    return [
        Problem(
            path="entry",
            message=f"{manifest.entry} is {len(entry.data)} bytes, more than an agent's "
            f"instructions may hold ({MAX_SKILL_BYTES // 1024} KiB)",
            hint="keep SKILL.md to instructions; put reference material in files beside it "
            "for the agent to read with its tools",
        )
    ]


@dataclass(frozen=True)
class Validation:
    manifest: Manifest | None
    problems: list[Problem]
    # What a deploy of the archive would leave out (bundle.read_upload), each with why.
    left_out: tuple[Told, ...] = ()


def validate_archive(ctx: Context, *, archive: bytes, caller: Principal) -> Validation:
    """Check a worker archive without storing anything. Needs the read scope."""
    caller.require("read")
    bundle = read_upload(archive, max_bytes=ctx.settings.max_bundle_bytes)
    manifest, problems = _validate_bundle(ctx, bundle)
    return Validation(manifest, problems, bundle.left_out)


def _validate_bundle(ctx: Context, bundle: Bundle) -> tuple[Manifest | None, list[Problem]]:
    if "worker.yml" not in bundle.files:
        return None, [
            Problem(
                path="",
                message="the worker has no worker.yml",
                hint="create worker.yml in the folder with at least `name: my-worker`",
            )
        ]
    text, problem = _utf8_text(bundle, "worker.yml")
    if problem is not None:
        return None, [problem]
    manifest, problems = check_manifest(text, bundle.files.keys())
    if manifest is not None:
        problems = (
            over_ceilings(manifest, ctx.settings)
            + trigger_callback_problems(ctx, manifest)
            + file_problems(manifest, bundle)
        )
        if problems:
            return None, problems
        if undecodable := _entry_problems(bundle, manifest):
            return None, undecodable
    return manifest, problems


def deploy(
    ctx: Context, *, archive: bytes, caller: Principal, activate: bool = True
) -> DeployResult:
    """Store the archive as a version of its worker and make that version active.

    Deploying content identical to an existing version of the worker creates nothing new;
    that version becomes the active one again. With `activate=False` (an eval gate decides
    later) the version is only stored, unless the worker has no active version yet. Needs
    the deploy scope (checked again in the storing transaction).
    """
    caller.require("deploy")
    bundle = read_upload(archive, max_bytes=ctx.settings.max_bundle_bytes)
    text = _bundle_manifest_text(bundle)
    manifest = parse_manifest(text, bundle.files.keys())
    over = (
        over_ceilings(manifest, ctx.settings)
        + trigger_callback_problems(ctx, manifest)
        + file_problems(manifest, bundle)
    )
    if over:
        raise manifest_invalid(over)
    if undecodable := _entry_problems(bundle, manifest):
        raise manifest_invalid(undecodable)
    _check_sandbox_configured(ctx, manifest)
    digest = bundle.digest
    normalised = bundle.to_archive()
    try:
        stored = _store_version(ctx, bundle, manifest, text, digest, normalised, caller, activate)
    except IntegrityError:
        # A concurrent first deploy of the same worker or content committed first (on
        # PostgreSQL both transactions saw no row); this one now finds it and reuses it.
        stored = _store_version(ctx, bundle, manifest, text, digest, normalised, caller, activate)
    return replace(stored, left_out=bundle.left_out)


def _check_sandbox_configured(ctx: Context, manifest: Manifest) -> None:
    """Refuse a worker whose worker.yml names a sandbox backend this server cannot run."""
    backend = manifest.sandbox.backend
    problem = configuration_problem(backend, ctx.settings) if backend else None
    if problem is not None:
        raise InvalidRequest(
            f"this worker asks for the {backend} sandbox, which this server has not "
            f"configured: {problem}",
            hint="set it in the floom server's environment and restart it, or remove "
            "sandbox.backend from worker.yml to use the server's default",
            details=[{"path": "sandbox.backend", "message": f"{problem}"}],
        )


def _utf8_text(bundle: Bundle, path: str, *, field: str = "") -> tuple[str, Problem | None]:
    """The text of a file floom itself reads (worker.yml, an agent's SKILL.md), or a problem
    when it is not UTF-8: read with its bytes replaced, the manifest stored and run (or the
    instructions an agent follows) would be other text than the version's file holds, which
    `floom check` of the same folder refuses."""
    data = bundle.files[path].data
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        message = f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line})"
        return "", Problem(path=field, message=message, hint=f"save {path} as UTF-8")


def _entry_problems(bundle: Bundle, manifest: Manifest) -> list[Problem]:
    """An agent's SKILL.md must be UTF-8 text, as worker.yml is."""
    if manifest.kind != "agent" or manifest.entry not in bundle.files:
        return []
    _, problem = _utf8_text(bundle, manifest.entry, field="entry")
    return [] if problem is None else [problem]


def _store_version(
    ctx: Context,
    bundle: Bundle,
    manifest: Manifest,
    text: str,
    digest: str,
    normalised: bytes,
    caller: Principal,
    activate: bool = True,
) -> DeployResult:
    actor = caller.actor
    # Outside the transaction: an object store's upload may take a while.
    archive = stage_blob(ctx.settings, ctx.engine, normalised, digest=digest)
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        version = s.exec(
            select(Version).where(Version.worker_name == manifest.name, Version.digest == digest)
        ).first()
        revived = version is None and _revive(
            s, version_id=f"v{digest[:12]}", worker_name=manifest.name, actor=actor
        )
        if revived:
            version = revived
        created = version is None or bool(revived)
        if version is None:
            insert_blob(s, archive)
            version = Version(
                id=f"v{digest[:12]}",
                worker_name=manifest.name,
                digest=digest,
                manifest_json=manifest.model_dump_json(),
                manifest_yaml=text,
                kind=manifest.kind,
                file_count=len(bundle.files),
                size=sum(len(f.data) for f in bundle.files.values()),
                deployed_by=actor,
            )
            s.add(version)
        worker = s.get(Worker, manifest.name)
        if worker is None:
            worker = Worker(name=manifest.name)
        if not activate and worker.active_version_id is not None:
            s.add(worker)
            return DeployResult(worker=worker, version=version, created=created, activated=False)
        activated = worker.active_version_id != version.id
        worker.active_version_id = version.id
        worker.updated_at = utcnow()
        s.add(worker)
        sync_triggers(s, worker_name=manifest.name, manifest=manifest)
    return DeployResult(worker=worker, version=version, created=created, activated=activated)


# A version kept for the runs of a deleted worker belongs to this name instead of the worker's:
# it no longer lists, rolls back or runs under the name, while its runs still read it.
RETIRED_PREFIX = "deleted:"


def retired_owner(deletion_id: str) -> str:
    return f"{RETIRED_PREFIX}{deletion_id}"


def _revive(s: Session, *, version_id: str, worker_name: str, actor: str | None) -> Version | None:
    """A retired version with the same content id, given to the redeployed worker as its
    first version: ids are content addresses, so the same files deployed again are it."""
    version = s.get(Version, version_id)
    if version is None or not version.worker_name.startswith(RETIRED_PREFIX):
        return None
    version.worker_name = worker_name
    version.created_at = utcnow()
    version.deployed_by = actor
    s.add(version)
    forget_versions([version_id])
    return version


def get_worker(ctx: Context, *, name: str, caller: Principal) -> Worker:
    """One worker; NotFound (naming the known ones) when there is none. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return _get_worker(s, name)


# The workers as this process last saw them, for the one check before a run is queued; the queueing
# transaction reads the row again under lock_worker and compares (services/runs/lifecycle.py).
_worker_cache: dict[tuple[int, str], Worker] = {}


def cached_worker(ctx: Context, *, name: str) -> Worker:
    """The worker as this process last read it, possibly stale: act on it only after
    checking it against the row lock_worker returns (then `remember_worker` that row)."""
    worker = _worker_cache.get((id(ctx.engine), name))
    if worker is None:
        worker = get_worker(ctx, name=name, caller=SYSTEM)
        remember_worker(ctx, worker)
    return worker


def remember_worker(ctx: Context, worker: Worker) -> None:
    if len(_worker_cache) >= 4096:
        _worker_cache.clear()
    _worker_cache[(id(ctx.engine), worker.name)] = worker


def forget_worker(ctx: Context, *, name: str) -> None:
    _worker_cache.pop((id(ctx.engine), name), None)


def lock_worker(s: Writer, name: str, *, version_id: str | None = None) -> Worker:
    """The worker, share-locked until the caller's transaction ends: a deletion at the same
    time either waits for that transaction and then sees what it wrote, or has committed and
    this raises NotFound (SQLite's write transactions are serial anyway). The row comes back
    as read, not attached to `s` (the callers only look at it).

    With `version_id`, the version must still be the worker's: another node may have retired
    it in a deletion after this process cached it.

    One statement reads the row and the version's owner (it runs for every queued run).
    """
    values = LOCK_WORKER.first(s, {"name": name, "version_id": version_id or ""})
    if values is None:
        raise _no_worker(s, name)
    owner = values.pop("version_owner")
    if version_id is not None and owner != name:
        forget_versions([version_id])
        raise NotFound(
            f"no version {quoted(version_id)} of worker '{name}'",
            hint=told(act("versions", worker=name), " lists the versions"),
        )
    return trusted_row(Worker, values)


@lru_cache(maxsize=1)
def _lock_statement() -> Any:
    # KEY SHARE on PostgreSQL: it waits only for a DELETE, not for a deploy or pause. The
    # version's owner is a subquery of the select list, which locks nothing.
    workers = Worker.__table__  # type: ignore[attr-defined]
    versions = Version.__table__  # type: ignore[attr-defined]
    owner = (
        sql_select(versions.c.worker_name)
        .where(versions.c.id == bindparam("version_id"))
        .scalar_subquery()
        .label("version_owner")
    )
    return (
        sql_select(*workers.c, owner)
        .where(workers.c.name == bindparam("name"))
        .with_for_update(read=True, key_share=True)
    )


LOCK_WORKER = hot.Statement("workers.lock", _lock_statement)


def _get_worker(s: Session, name: str) -> Worker:
    worker = s.get(Worker, name)
    if worker is None:
        raise _no_worker(s, name)
    return worker


def _no_worker(s: Writer, name: str) -> NotFound:
    known = list(s.execute(select(Worker.name).order_by(Worker.name).limit(20)).scalars())
    return NotFound(
        f"no worker named '{quoted(name)}'",
        hint=(
            f"known workers: {', '.join(known)}"
            if known
            else told("deploy one with ", act("deploy", folder="FOLDER"))
        ),
    )


def list_workers(
    ctx: Context, *, cursor: str | None = None, limit: int = 50, caller: Principal
) -> tuple[list[Worker], str | None]:
    """Workers by name; `cursor` is the last name of the previous page. Needs the read scope."""
    caller.require("read")
    paging.check_limit(limit)
    with session_scope(ctx.engine) as s:
        q = select(Worker).order_by(Worker.name).limit(limit + 1)
        if cursor := paging.name_cursor(cursor):
            q = q.where(Worker.name > cursor)
        rows = list(s.exec(q).all())
    next_cursor = rows[limit - 1].name if len(rows) > limit else None
    return rows[:limit], next_cursor


# Versions never change once stored, so a process may keep the rows it has read.
_version_cache: dict[tuple[int, str], Version] = {}


def get_version(
    ctx: Context, *, version_id: str, worker_name: str | None = None, caller: Principal
) -> Version:
    """One version (of `worker_name`, when given); NotFound otherwise. Needs the read scope."""
    caller.require("read")
    key = (id(ctx.engine), version_id)
    version = _version_cache.get(key)
    if version is None or (worker_name and version.worker_name != worker_name):
        # Read again on a mismatch too: a deletion retires versions and a redeploy revives them.
        with session_scope(ctx.engine) as s:
            version = s.get(Version, version_id)
        if version is not None and len(_version_cache) < 4096:
            _version_cache[key] = version
    if version is None or (worker_name and version.worker_name != worker_name):
        raise NotFound(
            f"no version {quoted(version_id)}"
            + (f" of worker '{worker_name}'" if worker_name else ""),
            hint=told(act("versions", worker=worker_name or "WORKER"), " lists the versions"),
        )
    return version


def forget_versions(version_ids: list[str]) -> None:
    """Drop versions from this process's cache, after a deletion retired or removed them."""
    wanted = set(version_ids)
    for key in [k for k in _version_cache if k[1] in wanted]:
        _version_cache.pop(key, None)


def list_versions(ctx: Context, *, name: str, caller: Principal) -> list[Version]:
    """A worker's versions, newest first. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        _get_worker(s, name)
        return list(
            s.exec(
                select(Version)
                .where(Version.worker_name == name)
                .order_by(col(Version.created_at).desc())
            ).all()
        )


@dataclass(frozen=True)
class Rollback:
    version: Version
    changed: bool  # False: that version was already the active one


def rollback(
    ctx: Context,
    *,
    name: str,
    version_id: str | None = None,
    run_id: str | None = None,
    caller: Principal,
    in_transaction: Callable[[Session, Version], None] | None = None,
) -> Rollback:
    """Make an earlier version active again, given directly or as the version of a run.
    Rolling back to the version that is already active changes nothing and succeeds
    (`changed` is False), so a retried rollback is harmless. `in_transaction` runs in the
    writing transaction with the version (restoring the worker's state with it); what it
    raises undoes the rollback. Needs the deploy scope (checked again in the writing
    transaction)."""
    caller.require("deploy")
    if bool(version_id) == bool(run_id):
        raise InvalidRequest(
            "give exactly one of a version id or a run id",
            hint=told(
                act("rollback", worker="WORKER", version="VERSION"),
                " or ",
                act("rollback", worker="WORKER", run_id="RUN_ID"),
            ),
        )
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        worker = _get_worker(s, name)
        if run_id:
            run = s.get(Run, run_id)
            if run is None or run.worker_name != name:
                raise NotFound(
                    f"no run {quoted(run_id)} of worker '{name}'",
                    hint=told(act("runs", worker=name), " lists its runs"),
                )
            version_id = run.version_id
        version = s.get(Version, version_id)
        if version is None or version.worker_name != name:
            raise NotFound(
                f"no version {quoted(str(version_id))} of worker '{name}'",
                hint=told(act("versions", worker=name), " lists the versions"),
            )
        if in_transaction is not None:
            in_transaction(s, version)
        if worker.active_version_id == version.id:
            return Rollback(version=version, changed=False)
        over = over_ceilings(manifest_of(version), ctx.settings)
        if over:  # deployed before this server's ceilings were set, or where they differ
            raise manifest_invalid(over)
        worker.active_version_id = version.id
        worker.updated_at = utcnow()
        s.add(worker)
        sync_triggers(s, worker_name=name, manifest=manifest_of(version))
    return Rollback(version=version, changed=True)


class ManifestUnreadable(Conflict):
    """A version's stored worker.yml that floom cannot read back (not JSON, over a bound, or
    not a manifest today's floom accepts: written by hand, by another program or an older
    floom). Every single view of it answers this 409; lists show the worker marked."""


@lru_cache(maxsize=512)
def _manifest_from_json(manifest_json: str) -> Manifest:
    return Manifest.model_validate(json.loads(manifest_json))


def manifest_of(version: Version) -> Manifest:
    """The version's manifest; ManifestUnreadable when its stored row cannot be read back."""
    try:
        return _manifest_from_json(version.manifest_json)
    except (ValueError, TypeError, RecursionError) as exc:  # pydantic's errors are ValueErrors
        why = type(exc).__name__ if isinstance(exc, RecursionError) else str(exc)[:200]
        name = version.worker_name
        raise ManifestUnreadable(
            f"version {version.id} of worker '{name}' holds a worker.yml floom cannot read ({why})",
            hint=told(
                f"deploy worker {name} again, or roll it back to another version (",
                act("versions", worker=name),
                ")",
            ),
        ) from None


def load_bundle(ctx: Context, *, version: Version) -> Bundle:
    data = read_blob(
        ctx.settings,
        ctx.engine,
        version.digest,
        what=f"the archive of version {version.id} of worker {version.worker_name}",
    )
    return read_archive(data, max_bytes=ctx.settings.max_bundle_bytes * 2)
