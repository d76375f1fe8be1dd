"""Workers, their versions, deploys and validation, as answered."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

from pydantic import Field

from floom.errors import InvalidRequest
from floom.manifest.schema import Manifest, Problem
from floom.schemas.common import IsoTime, Page, Public, Timestamp
from floom.schemas.runs import RunPublic, run_public
from floom.services.access import secrets
from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.triggers import registry as triggers
from floom.services.workers import diffs
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.services.workers.deletion import Deletion
from floom.store.models import Version, WorkerState

RECENT_RUNS = 10


class TriggerSummary(Public):
    """A trigger as worker listings show it; schedules add their cron, zone and next fire."""

    id: str
    kind: str
    paused: bool
    active: bool = Field(description="false while the trigger or its worker is paused")
    cron: str | None = None
    timezone: str | None = None
    next_fire: IsoTime | None = None

    omit_when_unset = frozenset({"cron", "timezone", "next_fire"})


class WorkerPublic(Public):
    """A worker; the title, description, kind and manifest are those of its active version,
    present when it has one."""

    name: str
    active_version_id: str | None
    paused: bool
    created_at: Timestamp
    updated_at: Timestamp
    title: str | None = None
    description: str | None = None
    kind: str | None = Field(None, json_schema_extra={"enum": ["script", "agent"]})
    manifest: dict[str, Any] | None = Field(None, description="worker.yml as JSON")
    triggers: list[TriggerSummary]

    omit_when_unset = frozenset({"title", "description", "kind", "manifest"})


class WorkerDetail(WorkerPublic):
    recent_runs: list[RunPublic] = Field(description=f"the last {RECENT_RUNS} runs, newest first")
    secrets_missing: list[str] = Field(
        default_factory=list,
        description="secrets the active version declares that are not set: its runs fail "
        "until they are (told to a key with the deploy scope, which may see secret names)",
    )

    model_key_missing: bool = Field(
        False,
        description="an agent worker whose runs fail until the floom server that runs agents "
        "has a model provider key (FLOOM_ANTHROPIC_API_KEY); said by a node that runs agents",
    )

    omit_when_unset = WorkerPublic.omit_when_unset | {"secrets_missing", "model_key_missing"}


class VersionPublic(Public):
    id: str
    worker: str
    digest: str = Field(description="sha256 of the normalised archive")
    kind: str = Field(json_schema_extra={"enum": ["script", "agent"]})
    file_count: int
    size: int
    created_at: Timestamp
    active: bool


class VersionFile(Public):
    path: str
    size: int


class VersionDetail(VersionPublic):
    manifest_yaml: str
    files: list[VersionFile]


class FileDiff(Public):
    path: str
    status: str = Field(json_schema_extra={"enum": ["added", "removed", "changed", "unchanged"]})
    old_size: int | None = Field(description="null when the file was added")
    new_size: int | None = Field(description="null when the file was removed")
    lines: list[str] = Field(
        description="the unified diff without its ---/+++ header; empty for binary or large files"
    )
    text: bool = Field(description="false for binary or large files, which are not diffed")


class VersionDiff(Public):
    """What changed between two versions of one worker: worker.yml first, then every file by
    path."""

    worker: str
    old: VersionPublic
    new: VersionPublic
    files: list[FileDiff]

    @property
    def changed(self) -> list[FileDiff]:
        return [f for f in self.files if f.status != "unchanged"]


class DeployResult(Public):
    worker: WorkerPublic
    version: VersionPublic
    created: bool = Field(description="false when the same content was deployed before")
    activated: bool


class RollbackResult(Public):
    worker: WorkerPublic
    version: VersionPublic
    changed: bool = Field(
        default=True, description="false when that version was already the active one"
    )


class ProblemPublic(Public):
    path: str = Field(description='where in worker.yml ("" is the whole document)')
    message: str
    hint: str | None


class ValidationResult(Public):
    valid: bool
    problems: list[ProblemPublic]
    manifest: dict[str, Any] | None = Field(description="the parsed manifest, when it parses")


# -- builders -----------------------------------------------------------------------------------


def worker_public(ctx: Context, *, name: str, caller: Principal) -> WorkerPublic:
    return WorkerPublic.model_validate(_worker_body(ctx, name, caller))


def _worker_body(ctx: Context, name: str, caller: Principal) -> dict[str, Any]:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    version = (
        workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
        if worker.active_version_id
        else None
    )
    body = workers.worker_to_dict(worker, version)
    body["triggers"] = triggers.summary(ctx, worker_name=name, caller=caller)
    return body


def worker_page(
    ctx: Context, *, cursor: str | None = None, limit: int = 50, caller: Principal
) -> Page[WorkerPublic]:
    rows, next_cursor = workers.list_workers(ctx, cursor=cursor, limit=limit, caller=caller)
    items = [worker_public(ctx, name=w.name, caller=caller) for w in rows]
    return Page[WorkerPublic](items=items, next_cursor=next_cursor)


def worker_detail(ctx: Context, *, name: str, caller: Principal) -> WorkerDetail:
    body = _worker_body(ctx, name, caller)
    recent, _cursor = runs.list_runs(ctx, worker=name, limit=RECENT_RUNS, caller=caller)
    body["recent_runs"] = [run_public(r, surface=caller.surface) for r in recent]
    declared = (body.get("manifest") or {}).get("secrets") or []
    if declared and caller.can("deploy"):
        body["secrets_missing"] = secrets.missing(ctx, declared, caller=caller)
    # Only a node that runs agents knows its own key; an api-only node says nothing.
    settings = ctx.settings
    if body.get("kind") == "agent" and "executor" in settings.roles and not settings.model_key:
        body["model_key_missing"] = True
    return WorkerDetail.model_validate(body)


def version_public(version: Version, *, active_id: str | None) -> VersionPublic:
    return VersionPublic.model_validate(workers.version_to_dict(version, active_id=active_id))


def version_page(ctx: Context, *, name: str, caller: Principal) -> Page[VersionPublic]:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    rows = workers.list_versions(ctx, name=name, caller=caller)
    items = [version_public(v, active_id=worker.active_version_id) for v in rows]
    return Page[VersionPublic](items=items, next_cursor=None)


def version_detail(ctx: Context, *, name: str, version_id: str, caller: Principal) -> VersionDetail:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    version = workers.get_version(ctx, version_id=version_id, worker_name=name, caller=caller)
    bundle = workers.load_bundle(ctx, version=version)
    body = workers.version_to_dict(version, active_id=worker.active_version_id)
    body["manifest_yaml"] = version.manifest_yaml
    body["files"] = [{"path": f.path, "size": len(f.data)} for f in bundle.files.values()]
    return VersionDetail.model_validate(body)


def version_diff(
    ctx: Context, *, name: str, old_id: str, new_id: str, caller: Principal
) -> VersionDiff:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    diff = diffs.diff_versions(ctx, worker_name=name, old_id=old_id, new_id=new_id, caller=caller)
    active_id = worker.active_version_id
    return VersionDiff(
        worker=name,
        old=version_public(diff.old, active_id=active_id),
        new=version_public(diff.new, active_id=active_id),
        files=[FileDiff.model_validate(asdict(f)) for f in diff.files],
    )


def deploy_result(ctx: Context, result: workers.DeployResult, *, caller: Principal) -> DeployResult:
    return DeployResult(
        worker=worker_public(ctx, name=result.worker.name, caller=caller),
        version=version_public(result.version, active_id=result.version.id),
        created=result.created,
        activated=result.activated,
    )


def rollback_result(
    ctx: Context, *, name: str, rollback: workers.Rollback, caller: Principal
) -> RollbackResult:
    return RollbackResult(
        worker=worker_public(ctx, name=name, caller=caller),
        version=version_public(rollback.version, active_id=rollback.version.id),
        changed=rollback.changed,
    )


def validation_result(manifest: Manifest | None, problems: list[Problem]) -> ValidationResult:
    return ValidationResult(
        valid=not problems,
        problems=[ProblemPublic.model_validate(p.to_dict()) for p in problems],
        manifest=manifest.model_dump(mode="json") if manifest else None,
    )


class WorkerDeleted(Public):
    """What a deletion did; the same record is kept as an audit event."""

    deleted: bool
    worker: str
    deletion_id: str
    purge_runs: bool
    versions: list[str]
    active_version_id: str | None
    runs_kept: int
    runs_purged: int
    runs_cancelled: int
    runs_stopping: int = Field(description="running runs asked to stop; they end shortly")
    triggers_removed: int
    approvals_closed: int
    webhook_deliveries_deleted: int
    blobs_deleted: int


def worker_deleted(deletion: Deletion) -> WorkerDeleted:
    return WorkerDeleted.model_validate({"deleted": True, **deletion.to_dict()})


# -- worker state -------------------------------------------------------------------------------


class StateVersionPublic(Public):
    """One kept version of a worker's state: who wrote it, when, from which run."""

    worker: str
    version: int
    size: int = Field(description="bytes of JSON")
    source: str = Field(
        json_schema_extra={"enum": list(worker_state.SOURCES)},
        description="run: a run's success; operator: set by a key; restore: an earlier "
        "version set again (restored_from)",
    )
    written_by: str | None = Field(description='"run:<id>" or the key that set it')
    run_id: str | None
    restored_from: int | None
    created_at: Timestamp


class WorkerStatePublic(Public):
    """A worker's state: the current version (0 before the first), and the value and record
    of the version asked for (the current one unless `version` was given)."""

    worker: str
    enabled: bool = Field(description="whether the worker's active version declares state")
    limit_bytes: int = Field(description="the largest state this worker may keep, as JSON")
    current_version: int
    version: int
    state: Any = Field(description="the value; null before the first state")
    written: StateVersionPublic | None = Field(description="null before the first state")


def state_version_public(row: WorkerState) -> StateVersionPublic:
    return StateVersionPublic(
        worker=row.worker_name,
        version=row.version,
        size=row.size,
        source=row.source,
        written_by=row.written_by,
        run_id=row.run_id,
        restored_from=row.restored_from,
        created_at=row.created_at,
    )


def worker_state_public(
    ctx: Context, *, name: str, version: int | None = None, caller: Principal
) -> WorkerStatePublic:
    current, row = worker_state.get_state(ctx, worker_name=name, version=version, caller=caller)
    worker = workers.get_worker(ctx, name=name, caller=caller)
    manifest = None
    if worker.active_version_id:
        active = workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
        with contextlib.suppress(workers.ManifestUnreadable):  # the state is shown all the same
            manifest = workers.manifest_of(active)
    return WorkerStatePublic(
        worker=name,
        enabled=bool(manifest and manifest.state.enabled),
        limit_bytes=(
            worker_state.limit_of(manifest, ctx.settings)
            if manifest
            else ctx.settings.max_state_bytes
        ),
        current_version=current,
        version=row.version if row else 0,
        state=worker_state.decode(row.state_json) if row else None,
        written=state_version_public(row) if row else None,
    )


def state_version_page(
    ctx: Context, *, name: str, cursor: str | None = None, limit: int = 50, caller: Principal
) -> Page[StateVersionPublic]:
    before = None
    if cursor is not None:
        if not cursor.isdigit():
            raise InvalidRequest(
                f"cursor {cursor!r} is not a state version",
                hint="pass the next_cursor of the previous page",
            )
        before = int(cursor)
    _, rows, next_before = worker_state.list_versions(
        ctx, worker_name=name, before=before, limit=limit, caller=caller
    )
    return Page[StateVersionPublic](
        items=[state_version_public(r) for r in rows],
        next_cursor=str(next_before) if next_before is not None else None,
    )
