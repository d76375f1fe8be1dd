"""A worker's state over MCP: read it (or a kept version), set it or restore a version, list
its versions; written against the Backend interface."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from floom.errors import InvalidRequest
from floom.mcp.render import Reply, short
from floom.mcp.toolkit import READ, WRITE, FloomTool, backend_of, floom_tool, off
from floom.schemas.workers import WorkerStatePublic
from floom.services.workers.state import MAX_VERSION

WorkerName = Annotated[str, Field(description="worker name")]
StateVersion = Annotated[
    int | None, Field(ge=1, le=MAX_VERSION, description="a kept state version")
]


def state_text(body: WorkerStatePublic) -> str:
    worker, written = body.worker, body.written
    if written is None:
        head = f"{worker} has no state yet (version 0)"
        return head if body.enabled else f"{head}; its worker.yml does not declare state"
    source = str(written.source)
    if written.restored_from:
        source += f" of version {written.restored_from}"
    by = f"run {written.run_id}" if written.run_id else written.written_by
    latest = "" if body.version == body.current_version else " (not the current one)"
    return (
        f"{worker} state version {body.version}{latest}, {source} by {by} at "
        f"{written.created_at.isoformat()}: {short(body.state, 2000)}"
    )


@floom_tool
async def get_worker_state(ctx: Context, worker: WorkerName, version: StateVersion = None) -> Reply:
    """A worker's state (worker.yml `state:`): what its last successful run left for the
    next, with who wrote it and from which run; or a kept earlier version."""
    body = await off(backend_of(ctx).get_state, worker, version=version)
    return Reply(state_text(body), body.to_json())


@floom_tool
async def set_worker_state(
    ctx: Context,
    worker: WorkerName,
    state: Annotated[Any, Field(description="the new state, any JSON value")] = None,
    from_version: Annotated[
        int | None,
        Field(ge=1, le=MAX_VERSION, description="or: set this kept version's state again"),
    ] = None,
    if_version: Annotated[
        int | None,
        Field(ge=0, le=MAX_VERSION, description="write only while the current version is this one"),
    ] = None,
) -> Reply:
    """Set a worker's state as a new version (its next run starts from it), or restore a
    kept version with from_version. Give exactly one of state and from_version."""
    if (state is None) == (from_version is None):
        raise InvalidRequest(
            "give exactly one of state and from_version",
            hint="e.g. state={'since': '2026-01-01'}, or from_version=3",
        )
    body = await off(
        backend_of(ctx).set_state,
        worker,
        state=state,
        from_version=from_version,
        if_version=if_version,
    )
    return Reply(state_text(body), body.to_json())


@floom_tool
async def list_worker_state_versions(
    ctx: Context,
    worker: WorkerName,
    limit: Annotated[int, Field(ge=1, le=500)] = 20,
) -> Reply:
    """A worker's kept state versions, newest first: who wrote each (a run or a key), when,
    and how big. get_worker_state(version=N) reads one."""
    page = await off(backend_of(ctx).state_versions, worker, limit=limit)
    lines = [
        f"version {v.version}: {v.source} by {v.written_by or '-'} at "
        f"{v.created_at.isoformat()} ({v.size} bytes)"
        for v in page.items
    ]
    return Reply("\n".join(lines) or f"{worker} has no state yet", page.to_json())


STATE_TOOLS: tuple[FloomTool, ...] = (
    FloomTool(get_worker_state, READ, "read"),
    FloomTool(set_worker_state, WRITE, "deploy"),
    FloomTool(list_worker_state_versions, READ, "read"),
)
