"""REST routes for workers, versions, deploys and rollbacks."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep, DeployKey, ReadKey
from floom.errors import InvalidRequest, PayloadTooLarge
from floom.manifest import manifest_json_schema
from floom.services import runs, triggers, worker_deletion, workers
from floom.services.audit import AuditActor
from floom.services.context import Context

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


def _worker_body(ctx: Context, worker_name: str) -> dict[str, Any]:
    worker = workers.get_worker(ctx, name=worker_name)
    version = (
        workers.get_version(ctx, version_id=worker.active_version_id)
        if worker.active_version_id
        else None
    )
    body = workers.worker_to_dict(worker, version)
    body["triggers"] = triggers.summary(ctx, worker_name=worker_name)
    return body


@router.post("/workers", status_code=201, summary="Deploy a worker (tar.gz of its folder)")
async def deploy_worker(request: Request, ctx: CtxDep, key: DeployKey) -> dict[str, Any]:
    archive = await _read_archive(request, ctx)
    result = await run_in_threadpool(workers.deploy, ctx, archive=archive, actor=key.id)
    return {
        "worker": await run_in_threadpool(_worker_body, ctx, result.worker.name),
        "version": workers.version_to_dict(result.version, active_id=result.version.id),
        "created": result.created,
        "activated": result.activated,
    }


@router.post("/workers/validate", summary="Check a worker archive without deploying it")
async def validate_worker(request: Request, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    archive = await _read_archive(request, ctx)
    manifest, problems = await run_in_threadpool(workers.validate_archive, ctx, archive=archive)
    return {
        "valid": not problems,
        "problems": [p.to_dict() for p in problems],
        "manifest": manifest.model_dump(mode="json") if manifest else None,
    }


@router.get("/workers")
def list_workers(
    ctx: CtxDep,
    _: ReadKey,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    rows, next_cursor = workers.list_workers(ctx, cursor=cursor, limit=limit)
    return {"items": [_worker_body(ctx, w.name) for w in rows], "next_cursor": next_cursor}


@router.get("/workers/{name}")
def get_worker(name: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    body = _worker_body(ctx, name)
    recent, _cursor = runs.list_runs(ctx, worker=name, limit=10)
    body["recent_runs"] = [runs.run_to_dict(r) for r in recent]
    return body


@router.get("/workers/{name}/versions")
def list_versions(name: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    worker = workers.get_worker(ctx, name=name)
    rows = workers.list_versions(ctx, name=name)
    return {
        "items": [workers.version_to_dict(v, active_id=worker.active_version_id) for v in rows],
        "next_cursor": None,
    }


@router.get("/workers/{name}/versions/{version_id}")
def get_version(name: str, version_id: str, ctx: CtxDep, _: ReadKey) -> dict[str, Any]:
    worker = workers.get_worker(ctx, name=name)
    version = workers.get_version(ctx, version_id=version_id, worker_name=name)
    bundle = workers.load_bundle(ctx, version=version)
    body = workers.version_to_dict(version, active_id=worker.active_version_id)
    body["manifest_yaml"] = version.manifest_yaml
    body["files"] = [{"path": f.path, "size": len(f.data)} for f in bundle.files.values()]
    return body


class RollbackRequest(BaseModel):
    version_id: str | None = None
    run_id: str | None = None


@router.post("/workers/{name}/rollback")
def rollback(name: str, body: RollbackRequest, ctx: CtxDep, _: DeployKey) -> dict[str, Any]:
    version = workers.rollback(ctx, name=name, version_id=body.version_id, run_id=body.run_id)
    return {
        "worker": _worker_body(ctx, name),
        "version": workers.version_to_dict(version, active_id=version.id),
    }


@router.delete(
    "/workers/{name}",
    summary="Delete a worker: its triggers stop, its runs are kept or purged (audited)",
)
def delete_worker(
    name: str,
    ctx: CtxDep,
    key: DeployKey,
    purge_runs: bool = Query(
        False,
        description="also delete its runs with their logs, artifacts, tool calls, approvals "
        "and versions; false keeps them readable",
    ),
) -> dict[str, Any]:
    deletion = worker_deletion.delete_worker(
        ctx, name=name, purge_runs=purge_runs, actor=AuditActor.of_key(key)
    )
    return {"deleted": True, **deletion.to_dict()}


@router.get("/manifest-schema", summary="JSON Schema of worker.yml")
def manifest_schema(_: ReadKey) -> dict[str, Any]:
    return manifest_json_schema()
