"""The stand-in's envd, the daemon inside each sandbox: the Connect RPC services
process.Process and filesystem.Filesystem (built on the SDK's own generated messages and ASGI
classes) and the /files and /health routes. One server answers for every sandbox; the
E2b-Sandbox-Id header the SDK sends says which one, as E2B's edge proxy does."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import shutil
import stat as stat_module
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.standins.e2b.core import StandinCore
from tests.standins.e2b.sandboxes import (
    Event,
    PathOutsideHome,
    RunningProcess,
    StandinSandbox,
)

SANDBOX_HEADER = "e2b-sandbox-id"
# A command started without a timeout runs until its sandbox ends (a day at most here).
NO_COMMAND_TIMEOUT = 86_400.0


class StreamDropped(Exception):
    """The connection carrying a stream drops (envd died, or the sandbox was killed)."""


def _sandbox(core: StandinCore, ctx: Any) -> StandinSandbox:
    sandbox = core.sandboxes.get(ctx.request_headers.get(SANDBOX_HEADER, ""))
    if sandbox is None:
        raise ConnectError(Code.UNAVAILABLE, "The sandbox was not found")
    return sandbox


def _started(pid: int) -> process_pb.ProcessEvent:
    start = process_pb.ProcessEvent.StartEvent(pid=pid)
    return process_pb.ProcessEvent(event=Oneof("start", start))  # type: ignore[arg-type]  # mypy widens the literal tag of Oneof(...) to str


def _process_event(event: Event) -> process_pb.ProcessEvent:
    if event.kind == "data":
        data = process_pb.ProcessEvent.DataEvent(
            output=Oneof(event.stream, event.data)  # type: ignore[arg-type]  # stdout or stderr
        )
        return process_pb.ProcessEvent(event=Oneof("data", data))  # type: ignore[arg-type]  # mypy widens the literal tag of Oneof(...) to str
    end = process_pb.ProcessEvent.EndEvent(
        exit_code=event.exit_code, exited=event.exited, status=event.status, error=event.error
    )
    return process_pb.ProcessEvent(event=Oneof("end", end))  # type: ignore[arg-type]  # mypy widens the literal tag of Oneof(...) to str


def _select(sandbox: StandinSandbox, selector: Any) -> RunningProcess:
    match selector.selector if selector is not None else None:
        case Oneof(field="pid", value=pid) if pid in sandbox.processes:
            return sandbox.processes[pid]
        case Oneof(field="tag", value=tag):
            for process in list(sandbox.processes.values()):
                if process.tag == tag:
                    return process
    raise ConnectError(Code.NOT_FOUND, "process not found")


class ProcessService(Process):
    """Methods not defined here answer UNIMPLEMENTED (the generated protocol's default)."""

    def __init__(self, core: StandinCore) -> None:
        self.core = core

    async def list(self, request: Any, ctx: Any) -> process_pb.ListResponse:
        sandbox = _sandbox(self.core, ctx)
        return process_pb.ListResponse(
            processes=[
                process_pb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag)
                for p in list(sandbox.processes.values())
            ]
        )

    async def start(self, request: Any, ctx: Any) -> AsyncIterator[process_pb.StartResponse]:
        sandbox = _sandbox(self.core, ctx)
        if request.has_field("pty"):
            raise ConnectError(Code.UNIMPLEMENTED, "the E2B stand-in has no PTY")
        tag = request.tag if request.has_field("tag") else None
        process = RunningProcess(
            pid=self.core.next_pid(), config=request.process, tag=tag, sandbox=sandbox
        )
        sandbox.processes[process.pid] = process
        line = " ".join([request.process.cmd, *request.process.args])
        with self.core.lock:
            self.core.command_starts.append((time.monotonic(), sandbox.sandbox_id, line))
        queue = process.subscribe()
        # As envd: the command's own timeout (the stream's deadline) bounds the process,
        # not the request; a client that goes away leaves the process running. Its sandbox's
        # end (which a set_timeout moves on) kills it too (kill_expired), not its end as it
        # stood when the command started.
        remaining_ms = ctx.timeout_ms
        process.start(
            local=self.core.local,
            scratch=self.core.root / "scratch" / f"{sandbox.sandbox_id}-{process.pid}",
            timeout_seconds=remaining_ms / 1000 if remaining_ms else NO_COMMAND_TIMEOUT,
        )
        yield process_pb.StartResponse(event=_started(process.pid))
        async for event in _events(process, queue):
            yield process_pb.StartResponse(event=event)

    async def connect(self, request: Any, ctx: Any) -> AsyncIterator[process_pb.ConnectResponse]:
        sandbox = _sandbox(self.core, ctx)
        process = _select(sandbox, request.process)
        queue = process.subscribe()
        yield process_pb.ConnectResponse(event=_started(process.pid))
        async for event in _events(process, queue):
            yield process_pb.ConnectResponse(event=event)

    async def send_signal(self, request: Any, ctx: Any) -> process_pb.SendSignalResponse:
        process = _select(_sandbox(self.core, ctx), request.process)
        # LocalSandbox ends a whole process tree with SIGKILL, for SIGTERM too.
        process.cancel.set()
        return process_pb.SendSignalResponse()

    async def send_input(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the E2B stand-in has no stdin for commands")

    async def close_stdin(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the E2B stand-in has no stdin for commands")

    async def stream_input(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the E2B stand-in has no stdin for commands")

    async def update(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the E2B stand-in has no PTY")


async def _events(
    process: RunningProcess, queue: asyncio.Queue[Event]
) -> AsyncIterator[process_pb.ProcessEvent]:
    try:
        while True:
            event = await queue.get()
            if event.kind == "abort":
                raise StreamDropped()
            if event.kind == "failed":
                raise ConnectError(Code.INTERNAL, event.error or "the command failed to start")
            yield _process_event(event)
            if event.kind == "end":
                return
    finally:
        process.unsubscribe(queue)


def _entry(sandbox: StandinSandbox, path: str, host: Path) -> filesystem_pb.EntryInfo:
    info = host.lstat()
    is_link = stat_module.S_ISLNK(info.st_mode)
    target = host.stat() if is_link and host.exists() else info
    file_type = (
        filesystem_pb.FileType.DIRECTORY
        if stat_module.S_ISDIR(target.st_mode)
        else filesystem_pb.FileType.FILE
    )
    modified = datetime.fromtimestamp(info.st_mtime, tz=UTC)
    return filesystem_pb.EntryInfo(
        name=host.name if path != "/" else "/",
        type=file_type,
        path=path,
        size=target.st_size,
        mode=stat_module.S_IMODE(target.st_mode),
        permissions=stat_module.filemode(target.st_mode),
        owner="user",
        group="user",
        modified_time=Timestamp.from_datetime(modified),
        symlink_target=str(host.readlink()) if is_link else None,
        is_symlink=is_link,
    )


def _resolve(sandbox: StandinSandbox, path: str) -> tuple[str, Path]:
    try:
        return sandbox.e2b_path(path), sandbox.host_path(path)
    except PathOutsideHome as exc:
        raise ConnectError(Code.PERMISSION_DENIED, str(exc)) from exc


class FilesystemService(Filesystem):
    """No watchers: those methods answer UNIMPLEMENTED."""

    def __init__(self, core: StandinCore) -> None:
        self.core = core

    async def stat(self, request: Any, ctx: Any) -> filesystem_pb.StatResponse:
        sandbox = _sandbox(self.core, ctx)
        path, host = _resolve(sandbox, request.path)
        if not host.exists() and not host.is_symlink():
            raise ConnectError(Code.NOT_FOUND, f"path not found: {path}")
        return filesystem_pb.StatResponse(entry=_entry(sandbox, path, host))

    async def list_dir(self, request: Any, ctx: Any) -> filesystem_pb.ListDirResponse:
        sandbox = _sandbox(self.core, ctx)
        path, host = _resolve(sandbox, request.path)
        if not host.is_dir():
            raise ConnectError(Code.NOT_FOUND, f"directory not found: {path}")
        entries: list[filesystem_pb.EntryInfo] = []

        def walk(e2b_dir: str, host_dir: Path, depth: int) -> None:
            for child in sorted(host_dir.iterdir()):
                child_path = f"{e2b_dir.rstrip('/')}/{child.name}"
                entries.append(_entry(sandbox, child_path, child))
                if depth > 1 and child.is_dir() and not child.is_symlink():
                    walk(child_path, child, depth - 1)

        walk(path, host, request.depth or 1)
        return filesystem_pb.ListDirResponse(entries=entries)

    async def make_dir(self, request: Any, ctx: Any) -> filesystem_pb.MakeDirResponse:
        sandbox = _sandbox(self.core, ctx)
        path, host = _resolve(sandbox, request.path)
        if host.exists():
            raise ConnectError(Code.ALREADY_EXISTS, f"directory already exists: {path}")
        host.mkdir(parents=True)
        return filesystem_pb.MakeDirResponse(entry=_entry(sandbox, path, host))

    async def move(self, request: Any, ctx: Any) -> filesystem_pb.MoveResponse:
        sandbox = _sandbox(self.core, ctx)
        _, source = _resolve(sandbox, request.source)
        path, destination = _resolve(sandbox, request.destination)
        if not source.exists():
            raise ConnectError(Code.NOT_FOUND, f"path not found: {request.source}")
        destination.parent.mkdir(parents=True, exist_ok=True)
        source.rename(destination)
        return filesystem_pb.MoveResponse(entry=_entry(sandbox, path, destination))

    async def remove(self, request: Any, ctx: Any) -> filesystem_pb.RemoveResponse:
        sandbox = _sandbox(self.core, ctx)
        path, host = _resolve(sandbox, request.path)
        if host.is_dir() and not host.is_symlink():
            await asyncio.to_thread(shutil.rmtree, host)
        elif host.exists() or host.is_symlink():
            host.unlink()
        else:
            raise ConnectError(Code.NOT_FOUND, f"path not found: {path}")
        return filesystem_pb.RemoveResponse()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def files_routes(core: StandinCore) -> Starlette:
    """envd's HTTP API: GET /files (download), POST /files (upload: multipart with one
    `file` part per file, the part's filename being its path, or an octet-stream body for
    ?path=), GET /health."""

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def download(request: Request) -> Response:
        sandbox = core.sandboxes[request.headers[SANDBOX_HEADER]]
        if core.download_body is not None:
            body = core.download_body(request.query_params.get("path", ""))
            encoded = {"content-encoding": core.download_encoding} if core.download_encoding else {}
            return StreamingResponse(body, media_type="application/octet-stream", headers=encoded)
        try:
            host = sandbox.host_path(request.query_params.get("path", ""))
        except PathOutsideHome as exc:
            return _error(400, str(exc))
        if host.is_dir():
            return _error(400, f"path '{request.query_params.get('path')}' is a directory")
        if not host.is_file():
            return _error(404, f"path '{request.query_params.get('path')}' does not exist")
        data = await asyncio.to_thread(host.read_bytes)
        return Response(data, media_type="application/octet-stream")

    async def upload(request: Request) -> Response:
        sandbox = core.sandboxes[request.headers[SANDBOX_HEADER]]
        pending: list[tuple[str, bytes]] = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            # The context closes the parts' spooled temporary files.
            async with request.form(max_files=100_000, max_fields=100_000) as form:
                for part in form.getlist("file"):
                    if isinstance(part, str):
                        return _error(400, "a file part without a filename")
                    name = request.query_params.get("path") or part.filename or ""
                    pending.append((name, await part.read()))
        else:
            body = await request.body()
            if request.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            pending.append((request.query_params.get("path", ""), body))
        written = []
        for name, data in pending:
            try:
                host = sandbox.host_path(name)
            except PathOutsideHome as exc:
                return _error(400, str(exc))
            if host.is_dir():
                return _error(400, f"path '{name}' is a directory")
            host.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(host.write_bytes, data)
            path = sandbox.e2b_path(name)
            written.append({"name": host.name, "type": "file", "path": path})
        return JSONResponse(written)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/files", download, methods=["GET"]),
            Route("/files", upload, methods=["POST"]),
        ]
    )


def envd_app(core: StandinCore) -> Any:
    """One ASGI app for every sandbox's envd, in front of it what E2B's edge proxy does:
    an unknown or killed sandbox gets 502 "... was not found", a sandbox whose envd died
    502 "... port is not open", a wrong X-Access-Token 401."""
    process_app = ProcessASGIApplication(ProcessService(core))
    filesystem_app = FilesystemASGIApplication(FilesystemService(core))
    http_app = files_routes(core)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        sandbox_id = headers.get(SANDBOX_HEADER, "")
        path = scope["path"]
        route = f"{scope['method']} {path}" if path in ("/files", "/health") else path
        core.count(route, sandbox_id)
        fault = core.take_fault(envd_route=route)
        if fault is not None:
            await _send_json(send, fault.status, {"code": fault.status, "message": fault.message})
            return
        sandbox = core.sandboxes.get(sandbox_id)
        if sandbox is None:
            message = f"The sandbox {sandbox_id} was not found"
            await _send_json(send, 502, {"code": 502, "message": message, "sandboxId": sandbox_id})
            return
        if not sandbox.envd_alive:
            message = f"The sandbox is running but port is not open (sandbox {sandbox_id})"
            await _send_json(send, 502, {"code": 502, "message": message, "sandboxId": sandbox_id})
            return
        if path != "/health" and headers.get("x-access-token") != sandbox.access_token:
            await _send_json(send, 401, {"code": 401, "message": "invalid access token"})
            return

        async def guarded_send(message: dict[str, Any]) -> None:
            # A sandbox that is gone, or whose envd died, drops the connection mid-stream.
            if sandbox_id not in core.sandboxes or not sandbox.envd_alive or core.envd_unreachable:
                raise StreamDropped()
            await send(message)

        if path.startswith("/process.Process/"):
            target: Any = process_app
        elif path.startswith("/filesystem.Filesystem/"):
            target = filesystem_app
        else:
            target = http_app
        # uvicorn closes a connection whose response never completed
        with contextlib.suppress(StreamDropped):
            await target(scope, receive, guarded_send)

    return app


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
