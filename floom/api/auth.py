"""Bearer API key authentication for every route, and each key's request rate."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from floom.config import Settings
from floom.errors import RateLimited
from floom.services.access import keys
from floom.services.access.principal import Principal, Surface
from floom.services.context import Context
from floom.store.models import ApiKey


def get_ctx(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


async def request_ctx(request: Request) -> Context:
    """get_ctx as a route dependency. Async on purpose: FastAPI runs a plain `def`
    dependency on a worker thread, a round trip per request for an attribute read."""
    return get_ctx(request)


CtxDep = Annotated[Context, Depends(request_ctx)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class RateLimiter:
    """A token bucket per API key id: `per_minute` requests a minute on average, up to
    `burst` at once; `per_minute` 0 lets everything through.

    The buckets live in this process only, so a cluster of N API nodes lets a key make N
    times as many requests. Keys are the ids of authenticated keys, so the table grows no
    larger than the keys table."""

    def __init__(
        self, *, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_minute / 60
        self.burst = max(burst, 1)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, when)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimiter:
        return cls(per_minute=settings.rate_limit_per_minute, burst=settings.rate_limit_burst)

    def charge(self, key_id: str) -> None:
        """Take one request from the key's bucket; raises RateLimited when it is empty."""
        if self.per_second <= 0:
            return
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.get(key_id, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.per_second)
            if tokens < 1:
                self._buckets[key_id] = (tokens, now)
                wait = math.ceil((1 - tokens) / self.per_second)
                raise RateLimited(
                    f"this API key made more than {round(self.per_second * 60)} requests a "
                    f"minute (bursts of {self.burst}); try again in {wait} s",
                    hint="slow down or spread the work over several keys; the operator sets "
                    "FLOOM_RATE_LIMIT_PER_MINUTE and FLOOM_RATE_LIMIT_BURST",
                    details={"retry_after_seconds": wait},
                )
            self._buckets[key_id] = (tokens - 1, now)


def rate_limiter(app: Any) -> RateLimiter:
    """The app's own limiter, made on first use: each app (and so each test) has its own."""
    limiter: RateLimiter | None = getattr(app.state, "rate_limiter", None)
    if limiter is None:
        limiter = app.state.rate_limiter = RateLimiter.from_settings(app.state.ctx.settings)
    return limiter


async def authenticate_request(request: Request) -> ApiKey:
    """The request's API key, charged one request of its rate: every REST route and /mcp
    authenticate here. Raises Unauthorized or RateLimited."""
    ctx, token = get_ctx(request), bearer_token(request)
    # A key authenticated moments ago is answered here, without a trip to a worker thread
    # (the trip costs more than the lookup); revocations reach that cache at once.
    key = keys.authenticated_recently(ctx, token)
    if key is None:
        key = await run_in_threadpool(keys.authenticate, ctx, token)
    rate_limiter(request.app).charge(key.id)
    return key


def request_surface(request: Request) -> Surface:
    """Which client made a REST request: floom's CLI and stdio MCP server say so in a
    header, so that refusals can name what that client offers; anything else is "rest"."""
    said = request.headers.get("x-floom-client", "")
    return said if said in ("cli", "mcp") else "rest"  # type: ignore[return-value]


def principal_of(request: Request, key: ApiKey) -> Principal:
    return Principal.of_key(key, surface=request_surface(request))


def require_scope(scope: str) -> Callable[..., object]:
    """A route's caller, refused unless it holds `scope`.

    The services decide access again with the same rule (Principal.require); the route
    declares its scope too so that a caller without it is refused before its body is read
    (403, not a 422 about a body it may not send) and so that the OpenAPI document and the
    authorization walk see every route's scope."""

    async def dependency(request: Request) -> Principal:
        caller = principal_of(request, await authenticate_request(request))
        # A refusal's hint names, beside each request it recommends, the scope this caller
        # lacks for it (floom.api.errors).
        request.state.floom_caller = caller
        caller.require(scope)
        return caller

    # Read by the authorization test that walks every route: a route's scope is declared
    # by the dependency it takes, never decided inside the handler.
    dependency.scope = scope  # type: ignore[attr-defined]
    return dependency


ReadCaller = Annotated[Principal, Depends(require_scope("read"))]
RunCaller = Annotated[Principal, Depends(require_scope("run"))]
DeployCaller = Annotated[Principal, Depends(require_scope("deploy"))]
AdminCaller = Annotated[Principal, Depends(require_scope("admin"))]
