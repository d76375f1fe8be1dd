"""The stand-in's control plane: E2B's REST API for sandboxes (create, get, list with a
metadata filter, kill, timeout, connect), in the JSON shapes of the SDK's generated models
(e2b/api/client/models: NewSandboxV2 in, Sandbox, SandboxDetail, ListedSandbox out)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.standins.e2b.core import ENVD_VERSION, QUOTA_MESSAGE, StandinCore
from tests.standins.e2b.sandboxes import StandinSandbox

CLIENT_ID = "standin"
DEFAULT_TIMEOUT = 300
_ID_SEGMENT = re.compile(r"^(/(?:v2/)?sandboxes/)[^/]+")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _created(sandbox: StandinSandbox) -> dict[str, Any]:
    return {
        "templateID": sandbox.template,
        "sandboxID": sandbox.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.access_token,
    }


def _listed(sandbox: StandinSandbox) -> dict[str, Any]:
    return {
        "templateID": sandbox.template,
        "sandboxID": sandbox.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": _time(sandbox.started_at),
        "endAt": _time(sandbox.end_at),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": dict(sandbox.metadata),
    }


def _detail(sandbox: StandinSandbox) -> dict[str, Any]:
    return {
        **_listed(sandbox),
        "envdAccessToken": sandbox.access_token,
        "allowInternetAccess": sandbox.allow_internet,
    }


def _str_map(value: Any) -> dict[str, str] | None:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None
    return dict(value)


def _creation(body: Any, core: StandinCore) -> dict[str, Any] | Response:
    """create_sandbox's arguments from a create request's body, or the API's refusal."""
    if not isinstance(body, dict) or not isinstance(body.get("templateID"), str):
        return _error(400, "Invalid request: templateID is required")
    template = body["templateID"]
    if template not in core.templates:
        return _error(404, f"template '{template}' not found")
    metadata, env_vars = _str_map(body.get("metadata")), _str_map(body.get("envVars"))
    if metadata is None or env_vars is None:
        return _error(400, "metadata and envVars must map strings to strings")
    timeout = body.get("timeout", DEFAULT_TIMEOUT)
    if not isinstance(timeout, int) or timeout <= 0:
        return _error(400, "timeout must be a positive number of seconds")
    return {
        "template": template,
        "timeout": timeout,
        "metadata": metadata,
        "env_vars": env_vars,
        "allow_internet": body.get("allow_internet_access", True) is not False,
    }


def _refusal(core: StandinCore, scope: dict[str, Any], label: str) -> Response | None:
    """The answer to a request refused before routing: a fault a test queued, or a bad key."""
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    fault = core.take_fault(control_route=label)
    if fault is not None:
        extra = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
        return _error(fault.status, fault.message, extra)
    if headers.get("x-api-key") != core.api_key:
        return _error(401, "Invalid API key")
    return None


def _listing(core: StandinCore, query: Any) -> Response:
    """One page of the running sandboxes whose metadata matches the query's."""
    wanted = {
        unquote(k): unquote(v)
        for k, v in parse_qsl(query.get("metadata", ""), keep_blank_values=True)
    }
    states = query.get("state", "running").split(",")
    found = [
        s
        for s in sorted(core.sandboxes.values(), key=lambda s: s.started_at)
        if "running" in states and all(s.metadata.get(k) == v for k, v in wanted.items())
    ]
    limit = int(query.get("limit") or 100)
    start = int(query.get("nextToken") or 0)
    page = found[start : start + limit]
    headers = {}
    if start + limit < len(found):
        headers["x-next-token"] = str(start + limit)
    return JSONResponse([_listed(s) for s in page], headers=headers)


def _extend(sandbox: StandinSandbox, timeout: Any) -> None:
    if isinstance(timeout, int) and timeout > 0:
        sandbox.end_at = datetime.now(UTC) + timedelta(seconds=timeout)


def control_app(core: StandinCore) -> Any:
    async def create(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Invalid request body")
        wanted = _creation(body, core)
        if isinstance(wanted, Response):
            return wanted
        if core.creation_delay > 0:
            await asyncio.sleep(core.creation_delay)
        with core.lock:
            if core.max_sandboxes is not None and len(core.sandboxes) >= core.max_sandboxes:
                return _error(429, QUOTA_MESSAGE.format(limit=core.max_sandboxes))
            sandbox = core.create_sandbox(**wanted)
        return JSONResponse(_created(sandbox), status_code=201)

    async def list_sandboxes(request: Request) -> Response:
        return _listing(core, request.query_params)

    async def get(request: Request) -> Response:
        sandbox = core.sandboxes.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        return JSONResponse(_detail(sandbox))

    def kill(request: Request) -> Response:
        # A plain function: Starlette runs it in a thread while the processes are killed.
        if not core.kill_sandbox(request.path_params["sandbox_id"]):
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        return Response(status_code=204)

    async def set_timeout(request: Request) -> Response:
        sandbox = core.sandboxes.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        _extend(sandbox, (await request.json()).get("timeout"))
        return Response(status_code=204)

    async def connect(request: Request) -> Response:
        sandbox = core.sandboxes.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        timeout = (await request.json()).get("timeout")
        if isinstance(timeout, int) and sandbox.remaining_seconds() < timeout:
            _extend(sandbox, timeout)
        return JSONResponse(_created(sandbox), status_code=200)

    async def refresh(request: Request) -> Response:
        return Response(status_code=204)

    routes = Starlette(
        routes=[
            Route("/v2/sandboxes", create, methods=["POST"]),
            Route("/v2/sandboxes", list_sandboxes, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", get, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", kill, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/timeout", set_timeout, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/refreshes", refresh, methods=["POST"]),
            Route("/v2/sandboxes/{sandbox_id}/connect", connect, methods=["POST"]),
        ]
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        match = _ID_SEGMENT.match(path)
        sandbox_id = match.group(0)[len(match.group(1)) :] if match else None
        label = _ID_SEGMENT.sub(r"\1{sandboxID}", path)
        route = f"{scope['method']} {label}"
        core.count(route, sandbox_id)
        response = _refusal(core, scope, route)
        if response is None:
            await routes(scope, receive, send)
        else:
            await response(scope, receive, send)

    return app
