"""Bearer API key authentication for every route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from floom.services import keys
from floom.services.context import Context
from floom.store.models import ApiKey


def get_ctx(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


CtxDep = Annotated[Context, Depends(get_ctx)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def require_scope(scope: str) -> Callable[..., object]:
    async def dependency(request: Request) -> ApiKey:
        ctx = get_ctx(request)
        key = await run_in_threadpool(keys.authenticate, ctx, bearer_token(request))
        keys.require(key, scope)
        request.state.api_key = key
        return key

    return dependency


ReadKey = Annotated[ApiKey, Depends(require_scope("read"))]
RunKey = Annotated[ApiKey, Depends(require_scope("run"))]
DeployKey = Annotated[ApiKey, Depends(require_scope("deploy"))]
AdminKey = Annotated[ApiKey, Depends(require_scope("admin"))]
