"""Request bodies are bounded before any route reads them.

FastAPI parses a JSON body before a route's dependencies run, so without this a caller
could make the server read and parse a body of any size before a quota refused it. The
limit is checked against Content-Length first and then counted as the body streams in, so
a chunked body cannot pass it either; at most the limit is held in memory. The whole body
has FLOOM_REQUEST_BODY_SECONDS to arrive: the body is read before any key is checked, so a
caller that declares a body and dribbles it (a slow-loris) is answered 408 and its
connection closed, not held for good.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from floom.config import Settings
from floom.errors import BodyTooSlow, FloomError, PayloadTooLarge

log = logging.getLogger("floom.api")

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyLimitMiddleware:
    """Answers 413 `payload_too_large` for a body over the limit of its route:
    FLOOM_MAX_BUNDLE_BYTES (plus base64's growth) for deploys, validations and /mcp (whose
    deploy tool carries files), FLOOM_MAX_REQUEST_BYTES for everything else. /hooks bound
    their own bodies (FLOOM_WEBHOOK_MAX_BYTES) and are left to do so."""

    def __init__(self, app: Any, *, settings: Settings) -> None:
        self.app = app
        self.bundle_limit = settings.max_bundle_bytes * 4 // 3 + 64 * 1024
        self.request_limit = settings.max_request_bytes
        self.body_seconds = settings.request_body_seconds

    def limit_for(self, path: str) -> int | None:
        if path.startswith("/hooks/"):
            return None
        if path in ("/api/v1/workers", "/api/v1/workers/validate") or path.startswith("/mcp"):
            return self.bundle_limit
        return self.request_limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, _too_large(limit))
            return
        # Read the body here, up to the limit, and hand it on whole: a route's own reader
        # would turn an exception raised mid-stream into its own 400.
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout(self.body_seconds):
                while True:
                    message: Message = await receive()
                    if message["type"] != "http.request":
                        break
                    chunk = message.get("body", b"")
                    received += len(chunk)
                    if received > limit:
                        await _refuse(send, _too_large(limit))
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        message = {}
                        break
        except TimeoutError:
            log.warning(
                "refused a request body not sent within %g s (FLOOM_REQUEST_BODY_SECONDS)",
                self.body_seconds,
            )
            await _refuse(
                send,
                BodyTooSlow(
                    f"the request body did not arrive within {self.body_seconds:g} seconds",
                    hint="send the whole body at once",
                ),
            )
            return
        if message:  # the client went away mid-body: the app hears it as it would have
            await self.app(scope, _replay([], message, receive), send)
            return
        await self.app(scope, _replay(chunks, None, receive), send)


def _replay(chunks: list[bytes], pending: Message | None, receive: Any) -> Any:
    """A receive callable that yields the buffered body once, then the original stream."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if pending is not None:
                return pending
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        message: Message = await receive()
        return message

    return replayed


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is over {limit} bytes",
        hint="send less: worker folders are bounded by FLOOM_MAX_BUNDLE_BYTES, other "
        "requests by FLOOM_MAX_REQUEST_BYTES",
        details={"limit_bytes": limit},
    )


async def _refuse(send: Any, error: FloomError) -> None:
    body = json.dumps({"error": error.to_dict()}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
