"""How a floom MCP tool runs: its declaration (annotations and the scope it needs), its
backend, blocking calls off the event loop, one result shape, waiting for a run, and packing
a worker folder."""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, ToolAnnotations

from floom.bundle import Bundle, BundleFile, read_folder
from floom.errors import InvalidRequest
from floom.hints import Told, act, told
from floom.mcp.backends.base import Backend
from floom.mcp.errors import tool_error
from floom.mcp.render import Reply
from floom.schemas.runs import RunDetail
from floom.services.runs.rules import ACTIVE as ACTIVE_STATUSES

if TYPE_CHECKING:
    from floom.mcp.server import FloomMCPServer

T = TypeVar("T")
MAX_WAIT_SECONDS = 600.0
# The server checks its own limit (FLOOM_MAX_BUNDLE_BYTES); this only stops runaway reads.
DEFAULT_MAX_BUNDLE_BYTES = 50 * 1024 * 1024


READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
RUNS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)


@dataclass(frozen=True)
class FloomTool:
    """A tool as the server registers it: the body, its hints, and the least API key scope
    (read, run, deploy, admin) that may call it. The scope decides whether a key's
    `tools/list` shows the tool, and a call without it is refused as `forbidden` before the
    body runs; the services behind the body decide again with the same rule."""

    fn: Callable[..., Awaitable[CallToolResult]]
    annotations: ToolAnnotations
    scope: str
    #: Arguments only a server on the caller's machine can honour (a folder path): tools/list
    #: of the server inside floom (`/mcp`) leaves them out, and its body refuses them.
    local_arguments: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.fn.__name__


def server_of(ctx: Context) -> FloomMCPServer:
    server: FloomMCPServer = ctx.mcp_server  # type: ignore[assignment]
    return server


def backend_of(ctx: Context) -> Backend:
    return server_of(ctx).backend_for(ctx)


async def off(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking backend call on a worker thread, keeping the event loop free."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def floom_tool(fn: Callable[..., Awaitable[Reply]]) -> Callable[..., Awaitable[CallToolResult]]:
    """Make a tool body's Reply the tool result, and any failure a tool error."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            reply = await fn(*args, **kwargs)
        except Exception as exc:  # the boundary of a tool call: errors become tool errors
            return tool_error(exc)
        return reply.to_result()

    return tool


async def settle(backend: Backend, run_id: str, seconds: float) -> tuple[RunDetail, bool]:
    """The run once it has left queued/running, or as it is when `seconds` have passed, and
    whether it has."""
    run = await backend.wait_for_run(run_id, seconds=max(0.0, min(seconds, MAX_WAIT_SECONDS)))
    return run, run.status not in ACTIVE_STATUSES


def pack(
    backend: Backend,
    folder: str | None,
    files: dict[str, str] | None,
    files_base64: dict[str, str] | None,
    executable: list[str] | None,
) -> tuple[bytes, tuple[Told, ...]]:
    """The tar.gz of a worker: a local folder (stdio), or files sent as content; and what of
    a folder was left out (environment files, FIFOs, sockets: `floom deploy` names them too)."""
    if folder and not backend.reads_local_folders:
        raise InvalidRequest(
            "this MCP endpoint takes the worker's files as `files`, not a `folder`: it runs "
            "inside the floom server and cannot read a folder on your machine",
            hint=told(
                "send the folder's files as `files` (relative path -> text) and binary ones "
                "as `files_base64` (relative path -> base64), or use the stdio server ",
                act("mcp"),
                " on your machine, which packs folders",
            ),
        )
    if folder and (files or files_base64):
        raise InvalidRequest(
            "give either `folder` or `files`, not both",
            hint=told("`folder` is a path on the machine running ", act("mcp")),
        )
    if folder:
        where = Path(folder).expanduser()
        read = read_folder(where, max_bytes=DEFAULT_MAX_BUNDLE_BYTES)
        return read.to_archive(), read.left_out
    if not files and not files_base64:
        example = "e.g. {'worker.yml': 'name: hi', 'run.py': ...}"
        raise InvalidRequest(
            "no worker given",
            hint=f"pass `folder` (a path on this machine) or `files`, {example}"
            if backend.reads_local_folders
            else f"pass the worker folder's files as `files`, {example}",
        )
    marked = {_clean(p) for p in executable or []}
    bundle: dict[str, BundleFile] = {}
    for raw, text in (files or {}).items():
        path = _clean(raw)
        bundle[path] = BundleFile(path, text.encode(), path in marked)
    for raw, encoded in (files_base64 or {}).items():
        path = _clean(raw)
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(
                f"files_base64['{raw}'] is not valid base64", hint="encode the bytes as base64"
            ) from exc
        bundle[path] = BundleFile(path, data, path in marked)
    return Bundle(bundle).to_archive(), ()


def _clean(path: str) -> str:
    # Normalise "./run.py"; unsafe paths ("../x", "/etc") are refused when the archive is read.
    return str(PurePosixPath(path.strip())) if path.strip() else path
