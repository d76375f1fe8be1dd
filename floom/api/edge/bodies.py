"""Request bodies are bounded before any route reads them, one bound per route.

FastAPI parses a JSON body before a route's dependencies run, so without this a caller
could make the server read and parse a body of any size before a quota refused it. The
limit is checked against Content-Length first and then counted as the body streams in, so
a chunked body cannot pass it either; at most the limit is held in memory. The whole body
has a deadline to arrive: it is read before any key or signature is checked, so a caller
that declares a body and dribbles it (a slow-loris) is answered 408 `request_timeout` and
its connection closed, not held for good.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from floom.api.address_limit import HookFailureBudget, client_key
from floom.api.errors import floom_error_response
from floom.config import Settings
from floom.errors import BodyTooSlow, FloomError, PayloadTooLarge
from floom.services.triggers import webhooks

log = logging.getLogger("floom.api")

Scope = dict[str, Any]
Message = dict[str, Any]
HOOKS = "/hooks/"


@dataclass(frozen=True)
class BodyBound:
    """What one route's request body may be: at most `limit` bytes, all of them within
    `seconds`. `too_large` and `too_slow` make the refusals (and say in the log which
    setting to raise); `admit`, when set, may refuse the request (raise a FloomError)
    before any of its body is read."""

    limit: int
    seconds: float
    too_large: Callable[[], FloomError]
    too_slow: Callable[[], FloomError]
    admit: Callable[[Scope], None] | None = None


class BodyLimitMiddleware:
    """Reads every request body (but GET, HEAD and OPTIONS requests') within its route's
    bound, and hands it on whole; 413 `payload_too_large` past the limit, 408
    `request_timeout` past the deadline:
    - /hooks: FLOOM_WEBHOOK_MAX_BYTES and FLOOM_WEBHOOK_BODY_SECONDS, refused without
      naming a setting (the sender is anonymous), and a sender whose failed signature
      checks are used up (HookFailureBudget) is answered 429 before its body is read;
    - deploys, validations and /mcp (whose deploy tool carries files):
      FLOOM_MAX_BUNDLE_BYTES (plus base64's growth) and FLOOM_REQUEST_BODY_SECONDS;
    - everything else: FLOOM_MAX_REQUEST_BYTES and FLOOM_REQUEST_BODY_SECONDS."""

    def __init__(self, app: Any, *, settings: Settings, hook_budget: HookFailureBudget) -> None:
        self.app = app
        seconds = settings.request_body_seconds
        self.bundle = _bound(settings.max_bundle_bytes * 4 // 3 + 64 * 1024, seconds)
        self.request = _bound(settings.max_request_bytes, seconds)
        hook_limit, hook_seconds = settings.webhook_max_bytes, settings.webhook_body_seconds

        def admit_hook(scope: Scope) -> None:
            hook = scope["path"][len(HOOKS) :]
            hook_budget.check(hook=hook, address=client_key(scope))

        self.hook = BodyBound(
            limit=hook_limit,
            seconds=hook_seconds,
            too_large=lambda: webhooks.payload_too_large(hook_limit),
            too_slow=lambda: webhooks.body_too_slow(hook_seconds),
            admit=admit_hook,
        )

    def bound_for(self, path: str) -> BodyBound:
        if path.startswith(HOOKS):
            return self.hook
        if path in ("/api/v1/workers", "/api/v1/workers/validate") or path.startswith("/mcp"):
            return self.bundle
        return self.request

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        bound = self.bound_for(scope["path"])
        try:
            if bound.admit is not None:
                bound.admit(scope)
            declared = _content_length(scope)
            if declared is not None and declared > bound.limit:
                raise bound.too_large()
            # Read the body here, up to the limit, and hand it on whole: a route's own
            # reader would turn an exception raised mid-stream into its own 400.
            chunks: list[bytes] = []
            received = 0
            try:
                async with asyncio.timeout(bound.seconds):
                    while True:
                        message: Message = await receive()
                        if message["type"] != "http.request":
                            break
                        chunk = message.get("body", b"")
                        received += len(chunk)
                        if received > bound.limit:
                            raise bound.too_large()
                        chunks.append(chunk)
                        if not message.get("more_body", False):
                            message = {}
                            break
            except TimeoutError:
                raise bound.too_slow() from None
        except FloomError as refusal:
            await _refuse(scope, receive, send, refusal)
            return
        if message:  # the client went away mid-body: the app hears it as it would have
            await self.app(scope, _replay([], message, receive), send)
            return
        await self.app(scope, _replay(chunks, None, receive), send)


def _bound(limit: int, seconds: float) -> BodyBound:
    return BodyBound(
        limit=limit,
        seconds=seconds,
        too_large=lambda: _too_large(limit),
        too_slow=lambda: _too_slow(seconds),
    )


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


def _too_slow(seconds: float) -> BodyTooSlow:
    log.warning("refused a request body not sent within %g s (FLOOM_REQUEST_BODY_SECONDS)", seconds)
    return BodyTooSlow(
        f"the request body did not arrive within {seconds:g} seconds",
        hint="send the whole body at once",
    )


async def _refuse(scope: Scope, receive: Any, send: Any, error: FloomError) -> None:
    """Answer `error` and close the connection: the rest of the body is not read."""
    response = floom_error_response(error, surface="rest")
    response.headers["connection"] = "close"
    await response(scope, receive, send)
