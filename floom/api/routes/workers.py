"""REST routes for workers, versions, deploys and rollbacks."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep, DeployCaller, ReadCaller
from floom.api.openapi import Cursor, Limit, WorkerName, authed
from floom.api.routing import JSONRoute
from floom.errors import InvalidRequest, PayloadTooLarge
from floom.hints import act, told
from floom.manifest.schema import manifest_json_schema
from floom.schemas import workers as worker_models
from floom.schemas.common import Page
from floom.services.context import Context
from floom.services.replays import gate as eval_gate
from floom.services.workers import deletion as worker_deletion
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.views import workers as views

router = APIRouter(prefix="/api/v1", tags=["workers"], route_class=JSONRoute)


async def _read_archive(request: Request, ctx: Context) -> bytes:
    limit = ctx.settings.max_bundle_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"the upload is larger than {limit // (1024 * 1024)} MiB",
            hint="remove large files from the worker folder or raise FLOOM_MAX_BUNDLE_BYTES",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"the upload is larger than {limit // (1024 * 1024)} MiB",
                hint="remove large files from the worker folder or raise FLOOM_MAX_BUNDLE_BYTES",
            )
        chunks.append(chunk)
    if not chunks:
        raise InvalidRequest(
            "the request body is empty",
            hint=told(
                "send the worker folder as a tar.gz body (",
                act("deploy", folder="FOLDER"),
                " does this)",
            ),
        )
    return b"".join(chunks)


# The archive is read from the raw body (any content type), so the document states it here.
ARCHIVE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "the worker folder as a tar.gz (or plain tar) archive: worker.yml plus "
        "its entry (run.py, run.sh, run.js, run.ts or SKILL.md); `floom deploy FOLDER` "
        "builds it. Bounded by FLOOM_MAX_BUNDLE_BYTES.",
        "content": {
            media: {"schema": {"type": "string", "format": "binary"}}
            for media in ("application/gzip", "application/x-tar", "application/octet-stream")
        },
    }
}


@router.post(
    "/workers",
    status_code=201,
    summary="Deploy a worker (tar.gz of its folder)",
    response_model=worker_models.DeployResult,
    responses=authed(400, 409, 413, 422),
    openapi_extra=ARCHIVE_BODY,
)
async def deploy_worker(
    request: Request,
    ctx: CtxDep,
    caller: DeployCaller,
    skip_eval_gate: bool = Query(
        False, description="activate even though the worker's eval gate (replay.gate) fails"
    ),
) -> worker_models.DeployResult:
    archive = await _read_archive(request, ctx)
    result = await run_in_threadpool(
        eval_gate.deploy_gated, ctx, archive=archive, caller=caller, skip_gate=skip_eval_gate
    )
    return await run_in_threadpool(views.deploy_result, ctx, result, caller=caller)


@router.post(
    "/workers/validate",
    summary="Check a worker archive without deploying it",
    response_model=worker_models.ValidationResult,
    responses=authed(400, 413, 422),
    openapi_extra=ARCHIVE_BODY,
)
async def validate_worker(
    request: Request, ctx: CtxDep, caller: ReadCaller
) -> worker_models.ValidationResult:
    archive = await _read_archive(request, ctx)
    validation = await run_in_threadpool(
        workers.validate_archive, ctx, archive=archive, caller=caller
    )
    return worker_models.ValidationResult.of(validation, surface=caller.surface)


@router.get("/workers", response_model=Page[worker_models.WorkerPublic], responses=authed(400, 422))
def list_workers(
    ctx: CtxDep, caller: ReadCaller, cursor: Cursor = None, limit: Limit = 50
) -> Page[worker_models.WorkerPublic]:
    return views.worker_page(ctx, cursor=cursor, limit=limit, caller=caller)


@router.get("/workers/{name}", response_model=worker_models.WorkerDetail, responses=authed(404))
def get_worker(name: WorkerName, ctx: CtxDep, caller: ReadCaller) -> worker_models.WorkerDetail:
    return views.worker_detail(ctx, name=name, caller=caller)


@router.get(
    "/workers/{name}/versions",
    response_model=Page[worker_models.VersionPublic],
    responses=authed(404),
)
def list_versions(
    name: WorkerName, ctx: CtxDep, caller: ReadCaller
) -> Page[worker_models.VersionPublic]:
    return views.version_page(ctx, name=name, caller=caller)


@router.get(
    "/workers/{name}/versions/{version_id}",
    response_model=worker_models.VersionDetail,
    responses=authed(404),
)
def get_version(
    name: WorkerName, version_id: str, ctx: CtxDep, caller: ReadCaller
) -> worker_models.VersionDetail:
    return views.version_detail(ctx, name=name, version_id=version_id, caller=caller)


class RollbackRequest(BaseModel):
    """Exactly one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": [field], "properties": {field: {"type": "string", "minLength": 1}}}
                for field in ("version_id", "run_id")
            ]
        },
    )
    version_id: str | None = Field(None, description="make this version active")
    run_id: str | None = Field(None, description="or the version this run ran")
    state_version: int | None = Field(
        None,
        ge=1,
        le=worker_state.MAX_VERSION,
        description="also restore this kept version of the worker's state",
    )


@router.post(
    "/workers/{name}/rollback",
    response_model=worker_models.RollbackResult,
    responses=authed(400, 404, 409, 422),
)
def rollback(
    name: WorkerName, body: RollbackRequest, ctx: CtxDep, caller: DeployCaller
) -> worker_models.RollbackResult:
    if body.state_version is not None:
        rollback = worker_state.rollback_with_state(
            ctx,
            name=name,
            version_id=body.version_id,
            run_id=body.run_id,
            state_version=body.state_version,
            caller=caller,
        )
    else:
        rollback = workers.rollback(
            ctx, name=name, version_id=body.version_id, run_id=body.run_id, caller=caller
        )
    return views.rollback_result(ctx, name=name, rollback=rollback, caller=caller)


@router.get(
    "/workers/{name}/state",
    summary="A worker's state: the current version, or one kept version",
    response_model=worker_models.WorkerStatePublic,
    responses=authed(404),
)
def get_state(
    name: WorkerName,
    ctx: CtxDep,
    caller: ReadCaller,
    version: int | None = Query(
        None, ge=1, le=worker_state.MAX_VERSION, description="a kept version; default: the current"
    ),
) -> worker_models.WorkerStatePublic:
    return views.worker_state_public(ctx, name=name, version=version, caller=caller)


class StateRequest(BaseModel):
    """Exactly one of `state` (the new value; null is a value) and `from_version` (set a kept
    version's value again: a restore)."""

    model_config = ConfigDict(extra="forbid")
    state: Any = Field(None, description="the new state, any JSON value")
    from_version: int | None = Field(
        None, ge=1, le=worker_state.MAX_VERSION, description="restore this kept version"
    )
    if_version: int | None = Field(
        None,
        ge=0,
        le=worker_state.MAX_VERSION,
        description="write only while the current version is this one (409 otherwise)",
    )


@router.put(
    "/workers/{name}/state",
    summary="Set a worker's state (a new version written by this key)",
    response_model=worker_models.WorkerStatePublic,
    responses=authed(400, 404, 409, 413, 422),
)
def set_state(
    name: WorkerName, body: StateRequest, ctx: CtxDep, caller: DeployCaller
) -> worker_models.WorkerStatePublic:
    given = "state" in body.model_fields_set
    if given == (body.from_version is not None):
        raise InvalidRequest(
            "give exactly one of state and from_version",
            hint='e.g. {"state": {"since": "2026-01-01"}} or {"from_version": 3}',
        )
    row = worker_state.set_state(
        ctx,
        worker_name=name,
        state=body.state,
        from_version=body.from_version,
        if_version=body.if_version,
        caller=caller,
    )
    return views.worker_state_public(ctx, name=name, version=row.version, caller=caller)


@router.get(
    "/workers/{name}/state/versions",
    summary="A worker's kept state versions, newest first",
    response_model=Page[worker_models.StateVersionPublic],
    responses=authed(400, 404, 422),
)
def list_state_versions(
    name: WorkerName, ctx: CtxDep, caller: ReadCaller, cursor: Cursor = None, limit: Limit = 50
) -> Page[worker_models.StateVersionPublic]:
    return views.state_version_page(ctx, name=name, cursor=cursor, limit=limit, caller=caller)


@router.delete(
    "/workers/{name}",
    summary="Delete a worker: its triggers stop, its runs are kept or purged (audited)",
    response_model=worker_models.WorkerDeleted,
    responses=authed(404, 409, 422),
)
def delete_worker(
    name: WorkerName,
    ctx: CtxDep,
    caller: DeployCaller,
    purge_runs: bool = Query(
        False,
        description="also delete its runs with their logs, artifacts, tool calls, approvals "
        "and versions; false keeps them readable",
    ),
) -> worker_models.WorkerDeleted:
    deletion = worker_deletion.delete_worker(ctx, name=name, purge_runs=purge_runs, caller=caller)
    return worker_models.WorkerDeleted.of(deletion)


@router.get(
    "/manifest-schema",
    summary="JSON Schema of worker.yml",
    response_model=dict[str, Any],
    responses=authed(),
)
def manifest_schema(_: ReadCaller) -> dict[str, Any]:
    return manifest_json_schema()
