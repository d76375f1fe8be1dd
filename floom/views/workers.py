"""Workers, their versions, deploys, validation and state, as answered."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any, TypeVar

from floom.schemas.common import Page
from floom.schemas.workers import (
    RECENT_RUNS,
    DeployResult,
    FileDiff,
    RollbackResult,
    StateVersionPublic,
    TriggerSummary,
    VersionDetail,
    VersionDiff,
    VersionFile,
    VersionPublic,
    WorkerDetail,
    WorkerPublic,
    WorkerStatePublic,
    left_out_said,
)
from floom.services import paging
from floom.services.access import secrets
from floom.services.access.principal import Principal
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.triggers import registry as triggers
from floom.services.workers import diffs
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.views.runs import run_public

W = TypeVar("W", bound=WorkerPublic)


def worker_public(ctx: Context, *, name: str, caller: Principal) -> WorkerPublic:
    return _worker(WorkerPublic, ctx, name, caller)


def _worker(model: type[W], ctx: Context, name: str, caller: Principal, **extra: Any) -> W:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    version = (
        workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
        if worker.active_version_id
        else None
    )
    summary = triggers.summary(ctx, worker_name=name, caller=caller)
    manifest, unreadable = None, None
    if version is not None:
        try:
            manifest = workers.manifest_of(version)
        except workers.ManifestUnreadable as exc:  # listed, marked: one row must not break a list
            unreadable = exc.message
    return model.of(
        worker,
        version=version,
        manifest=manifest,
        unreadable=unreadable,
        triggers=[TriggerSummary.model_validate(t) for t in summary],
        **extra,
    )


def worker_page(
    ctx: Context, *, cursor: str | None = None, limit: int = 50, caller: Principal
) -> Page[WorkerPublic]:
    rows, next_cursor = workers.list_workers(ctx, cursor=cursor, limit=limit, caller=caller)
    items = [worker_public(ctx, name=w.name, caller=caller) for w in rows]
    return Page[WorkerPublic](items=items, next_cursor=next_cursor)


def worker_detail(ctx: Context, *, name: str, caller: Principal) -> WorkerDetail:
    recent, _cursor = runs.list_runs(ctx, worker=name, limit=RECENT_RUNS, caller=caller)
    recent_runs = [run_public(r, surface=caller.surface) for r in recent]
    detail = _worker(WorkerDetail, ctx, name, caller, recent_runs=recent_runs)
    declared = (detail.manifest or {}).get("secrets") or []
    if declared and caller.can("deploy"):
        detail.secrets_missing = secrets.missing(ctx, declared, caller=caller)
    # Only a node that runs agents knows its own key; an api-only node says nothing.
    settings = ctx.settings
    if detail.kind == "agent" and "executor" in settings.roles and not settings.model_key:
        detail.model_key_missing = True
    return detail


def version_page(ctx: Context, *, name: str, caller: Principal) -> Page[VersionPublic]:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    rows = workers.list_versions(ctx, name=name, caller=caller)
    items = [VersionPublic.of(v, active_id=worker.active_version_id) for v in rows]
    return Page[VersionPublic](items=items, next_cursor=None)


def version_detail(ctx: Context, *, name: str, version_id: str, caller: Principal) -> VersionDetail:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    version = workers.get_version(ctx, version_id=version_id, worker_name=name, caller=caller)
    bundle = workers.load_bundle(ctx, version=version)
    return VersionDetail.of(
        version,
        active_id=worker.active_version_id,
        manifest_yaml=version.manifest_yaml,
        files=[VersionFile(path=f.path, size=len(f.data)) for f in bundle.files.values()],
    )


def version_diff(
    ctx: Context, *, name: str, old_id: str, new_id: str, caller: Principal
) -> VersionDiff:
    worker = workers.get_worker(ctx, name=name, caller=caller)
    diff = diffs.diff_versions(ctx, worker_name=name, old_id=old_id, new_id=new_id, caller=caller)
    active_id = worker.active_version_id
    return VersionDiff(
        worker=name,
        old=VersionPublic.of(diff.old, active_id=active_id),
        new=VersionPublic.of(diff.new, active_id=active_id),
        files=[FileDiff.model_validate(asdict(f)) for f in diff.files],
    )


def deploy_result(ctx: Context, result: workers.DeployResult, *, caller: Principal) -> DeployResult:
    return DeployResult(
        worker=worker_public(ctx, name=result.worker.name, caller=caller),
        version=VersionPublic.of(result.version, active_id=result.version.id),
        created=result.created,
        activated=result.activated,
        left_out=left_out_said(result.left_out, surface=caller.surface),
    )


def rollback_result(
    ctx: Context, *, name: str, rollback: workers.Rollback, caller: Principal
) -> RollbackResult:
    return RollbackResult(
        worker=worker_public(ctx, name=name, caller=caller),
        version=VersionPublic.of(rollback.version, active_id=rollback.version.id),
        changed=rollback.changed,
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
        written=StateVersionPublic.of(row) if row else None,
    )


def state_version_page(
    ctx: Context, *, name: str, cursor: str | None = None, limit: int = 50, caller: Principal
) -> Page[StateVersionPublic]:
    before = paging.number_cursor(cursor, most=worker_state.MAX_VERSION)
    _, rows, next_before = worker_state.list_versions(
        ctx, worker_name=name, before=before, limit=limit, caller=caller
    )
    return Page[StateVersionPublic](
        items=[StateVersionPublic.of(r) for r in rows],
        next_cursor=str(next_before) if next_before is not None else None,
    )
