"""REST routes for workers, versions, deploys and rollbacks."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep, DeployCaller, ReadCaller
from floom.api.openapi import Cursor, Limit, WorkerName, authed
from floom.errors import InvalidRequest, PayloadTooLarge
from floom.manifest.schema import manifest_json_schema
from floom.schemas import workers as views
from floom.schemas.common import Page
from floom.services.context import Context
from floom.services.replays import gate as eval_gate
from floom.services.workers import deletion as worker_deletion
from floom.services.workers import versions as workers

router = APIRouter(prefix="/api/v1", tags=["workers"])


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
            hint="send the worker folder as a tar.gz body (`floom deploy FOLDER` does this)",
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
    response_model=views.DeployResult,
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
) -> views.DeployResult:
    archive = await _read_archive(request, ctx)
    result = await run_in_threadpool(
        eval_gate.deploy_gated, ctx, archive=archive, caller=caller, skip_gate=skip_eval_gate
    )
    return await run_in_threadpool(views.deploy_result, ctx, result, caller=caller)


@router.post(
    "/workers/validate",
    summary="Check a worker archive without deploying it",
    response_model=views.ValidationResult,
    responses=authed(400, 413, 422),
    openapi_extra=ARCHIVE_BODY,
)
async def validate_worker(
    request: Request, ctx: CtxDep, caller: ReadCaller
) -> views.ValidationResult:
    archive = await _read_archive(request, ctx)
    manifest, problems = await run_in_threadpool(
        workers.validate_archive, ctx, archive=archive, caller=caller
    )
    return views.validation_result(manifest, problems)


@router.get("/workers", response_model=Page[views.WorkerPublic], responses=authed(400, 422))
def list_workers(
    ctx: CtxDep, caller: ReadCaller, cursor: Cursor = None, limit: Limit = 50
) -> Page[views.WorkerPublic]:
    return views.worker_page(ctx, cursor=cursor, limit=limit, caller=caller)


@router.get("/workers/{name}", response_model=views.WorkerDetail, responses=authed(404))
def get_worker(name: WorkerName, ctx: CtxDep, caller: ReadCaller) -> views.WorkerDetail:
    return views.worker_detail(ctx, name=name, caller=caller)


@router.get(
    "/workers/{name}/versions",
    response_model=Page[views.VersionPublic],
    responses=authed(404),
)
def list_versions(name: WorkerName, ctx: CtxDep, caller: ReadCaller) -> Page[views.VersionPublic]:
    return views.version_page(ctx, name=name, caller=caller)


@router.get(
    "/workers/{name}/versions/{version_id}",
    response_model=views.VersionDetail,
    responses=authed(404),
)
def get_version(
    name: WorkerName, version_id: str, ctx: CtxDep, caller: ReadCaller
) -> views.VersionDetail:
    return views.version_detail(ctx, name=name, version_id=version_id, caller=caller)


class RollbackRequest(BaseModel):
    """Exactly one of the two."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": [field], "properties": {field: {"type": "string", "minLength": 1}}}
                for field in ("version_id", "run_id")
            ]
        }
    )
    version_id: str | None = Field(None, description="make this version active")
    run_id: str | None = Field(None, description="or the version this run ran")


@router.post(
    "/workers/{name}/rollback",
    response_model=views.RollbackResult,
    responses=authed(400, 404, 409, 422),
)
def rollback(
    name: WorkerName, body: RollbackRequest, ctx: CtxDep, caller: DeployCaller
) -> views.RollbackResult:
    rollback = workers.rollback(
        ctx, name=name, version_id=body.version_id, run_id=body.run_id, caller=caller
    )
    return views.rollback_result(ctx, name=name, rollback=rollback, caller=caller)


@router.delete(
    "/workers/{name}",
    summary="Delete a worker: its triggers stop, its runs are kept or purged (audited)",
    response_model=views.WorkerDeleted,
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
) -> views.WorkerDeleted:
    deletion = worker_deletion.delete_worker(ctx, name=name, purge_runs=purge_runs, caller=caller)
    return views.worker_deleted(deletion)


@router.get(
    "/manifest-schema",
    summary="JSON Schema of worker.yml",
    response_model=dict[str, Any],
    responses=authed(),
)
def manifest_schema(_: ReadCaller) -> dict[str, Any]:
    return manifest_json_schema()
