"""The MCP endpoint at `/mcp` on the floom server (Streamable HTTP): each request carries its
own `Authorization: Bearer <key>`, and tools run floom's services with that key's scope."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
from fastapi import FastAPI
from mcp.server.mcpserver import Context
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from floom.api.auth import authenticate_request, bearer_token
from floom.api.errors import error_response, floom_error_response
from floom.api.routes.runs import SSE_RECHECK_SECONDS
from floom.config import Settings
from floom.errors import FloomError, Unauthorized
from floom.mcp.backends.local import CatalogSource, LocalBackend
from floom.mcp.server import FloomMCPServer
from floom.services.access import keys
from floom.services.access.principal import Principal
from floom.services.runs import waits as run_waits
from floom.store.models import ApiKey

log = logging.getLogger("floom.mcp")

PATH = "/mcp"
# Deploys made outside MCP (CLI, REST, UI) reach listening clients within this many seconds.
POLL_SECONDS = 5.0
KEY_STATE = "floom_api_key"
LISTEN_METHOD = "subscriptions/listen"
# Enough of a request body to read a subscription's request whole.
LISTEN_BODY_BYTES = 64 * 1024
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
PUBLIC_URL_HINT = (
    "set FLOOM_PUBLIC_URL to the URL clients use to reach floom (e.g. https://floom.example.com)"
)


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """The DNS-rebinding guard: loopback, the bound address and FLOOM_PUBLIC_URL's host are
    the Host (and Origin) values accepted; a proxy forwarding another host needs
    FLOOM_PUBLIC_URL."""
    hosts = ["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    names: list[str] = []
    if settings.host in WILDCARD_BINDS:
        names.append(socket.gethostname())
    else:
        names.append(f"[{settings.host}]" if ":" in settings.host else settings.host)
    for name in names:
        hosts += [name, f"{name}:*"]
        origins += [f"http://{name}:*", f"https://{name}:*"]
    if settings.public_url:
        url = urlsplit(settings.public_url)
        if url.netloc:
            hosts.append(url.netloc)
            origins.append(f"{url.scheme}://{url.netloc}")
            if url.port is None and url.hostname:
                hosts.append(f"{url.hostname}:*")
                origins.append(f"{url.scheme}://{url.hostname}:*")
    elif settings.host in WILDCARD_BINDS:
        log.warning("the MCP endpoint accepts only local Host headers: %s", PUBLIC_URL_HINT)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(hosts)),
        allowed_origins=list(dict.fromkeys(origins)),
    )


class MCPEndpoint:
    """The MCP server mounted in a floom app. `running()` belongs in the app's lifespan."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.app = app
        self.security = transport_security(settings)
        self.server = FloomMCPServer(
            backend_for=self._backend_for,
            load_workers=CatalogSource(lambda: app.state.ctx),
            poll_seconds=POLL_SECONDS,
        )
        # Room for a worker folder sent as file contents (base64 grows it by a third).
        body_limit = max(DEFAULT_MAX_REQUEST_BODY_SIZE, settings.max_bundle_bytes * 3 // 2)
        # Called for its side effect: it creates the session manager that serves requests.
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=self.security,
            max_request_body_size=body_limit,
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            yield

    def _backend_for(self, ctx: Context) -> LocalBackend:
        request = ctx.request_context.request
        key = getattr(getattr(request, "state", None), KEY_STATE, None)
        if not isinstance(key, ApiKey):
            raise Unauthorized("no API key given", hint="send `Authorization: Bearer <key>`")
        base_url = str(request.base_url) if isinstance(request, Request) else ""
        caller = Principal.of_key(key, surface="mcp")
        return LocalBackend(self.app.state.ctx, caller, base_url=base_url)


def guard_for(endpoint: MCPEndpoint) -> _Guard:
    """The ASGI app that serves /mcp requests for `endpoint` (mounted by floom.api.mcp_mount)."""
    return _Guard(endpoint)


class _Guard:
    """Checks the Host header and the API key before a request reaches the MCP transport,
    answering refusals in floom's error shape."""

    def __init__(self, endpoint: MCPEndpoint) -> None:
        self.endpoint = endpoint
        self.hosts = TransportSecurityMiddleware(endpoint.security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        refusal = await self.hosts.validate_request(request)
        if refusal is not None:
            what = "Origin" if refusal.status_code == 403 else "Host"
            value = request.headers.get(what.lower(), "")
            response = error_response(
                refusal.status_code,
                "host_not_allowed",
                f"the MCP endpoint refuses requests with {what} '{value}'",
                PUBLIC_URL_HINT,
            )
            await response(scope, receive, send)
            return
        try:
            key = await authenticate_request(request)
        except FloomError as exc:
            response = floom_error_response(exc, surface="mcp")
            if exc.status == 401:
                response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[KEY_STATE] = key
        token = bearer_token(request)
        if request.method != "GET":
            await self._serve_while_key_holds(scope, receive, send, token, key.id)
            return
        # A GET opens a session's event stream, held until the client leaves: it counts
        # against the key's open streams, as a log stream does.
        ctx = self.endpoint.app.state.ctx
        try:
            held = run_waits.hold_stream(ctx, holder=key.id)
        except FloomError as exc:
            await floom_error_response(exc, surface="mcp")(scope, receive, send)
            return
        with held:
            await self._serve_while_key_holds(scope, receive, send, token, key.id)

    async def _serve_while_key_holds(
        self, scope: Scope, receive: Receive, send: Send, token: str | None, key_id: str
    ) -> None:
        """Serve a request until it is answered, the client leaves, or the key it came with
        no longer holds: asked every SSE_RECHECK_SECONDS, as the log streams do. Most
        requests are answered sooner; two kinds last: a session's GET event stream
        (handshake-era clients) and a `subscriptions/listen` POST (2026-07-28 clients), each
        held open for as long as the client listens. An answer cut so is ended in good form,
        and the client's next request is refused by the key check."""
        ctx = self.endpoint.app.state.ctx
        started = finished = revoked = refused = False
        head = bytearray()
        holds = ExitStack()

        async def reading() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(head) < LISTEN_BODY_BYTES:
                head.extend(message.get("body", b"")[: LISTEN_BODY_BYTES - len(head)])
            return message

        async def tracked(message: Message) -> None:
            nonlocal started, finished, refused
            if refused:
                return
            if message["type"] == "http.response.start":
                if scope["method"] == "POST" and _listens(message, bytes(head)):
                    # A subscription lasts as a GET event stream does: counted as one.
                    try:
                        holds.enter_context(run_waits.hold_stream(ctx, holder=key_id))
                    except FloomError as exc:
                        refused = True
                        await floom_error_response(exc, surface="mcp")(scope, receive, send)
                        tasks.cancel_scope.cancel()
                        return
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        async def recheck(cancel: anyio.CancelScope) -> None:
            nonlocal revoked
            while True:
                await anyio.sleep(SSE_RECHECK_SECONDS)
                try:
                    await anyio.to_thread.run_sync(keys.authenticate, ctx, token)
                except FloomError:
                    revoked = True
                    cancel.cancel()
                    return

        with holds:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(recheck, tasks.cancel_scope)
                await self.endpoint.server.session_manager.handle_request(scope, reading, tracked)
                tasks.cancel_scope.cancel()
        if revoked and started and not finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _listens(start: Message, body: bytes) -> bool:
    """Whether a POST answered with `start` is a `subscriptions/listen`: an event stream
    answering that method (its request is small: LISTEN_BODY_BYTES hold it whole)."""
    headers = dict(start.get("headers") or [])
    if not headers.get(b"content-type", b"").startswith(b"text/event-stream"):
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    messages = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == LISTEN_METHOD for m in messages)
