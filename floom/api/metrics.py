"""/metrics in the Prometheus text format, behind an API key with the read scope.

A router of its own, so that a node without the `api` role can serve it beside /healthz.
Prometheus sends the key as a bearer token (docs/how-to/operations.md, "Metrics").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from floom.api.auth import CtxDep, ReadCaller
from floom.api.routing import JSONRoute

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

router = APIRouter(tags=["health"], route_class=JSONRoute)


def _registry(request: Request, ctx: CtxDep) -> CollectorRegistry:
    """One registry per app (not prometheus-client's global one): several apps in one
    process, as in tests, each report their own store."""
    # Imported on first use: prometheus-client at the first scrape; a node that nobody scrapes need
    # not hold it (about 1 MiB resident).
    from prometheus_client import CollectorRegistry

    from floom.services.ops.metrics import StoreCollector, WarmCollector

    registry: CollectorRegistry | None = getattr(request.app.state, "metrics_registry", None)
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(ctx))
        node = getattr(request.app.state, "node", None)
        executor = getattr(node, "executor", None)
        if executor is not None:
            registry.register(WarmCollector(executor.warm_stats))
        request.app.state.metrics_registry = registry
    return registry


@router.get("/metrics", response_class=Response, include_in_schema=False)
def metrics(request: Request, ctx: CtxDep, caller: ReadCaller) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    from floom.services.ops.metrics import exposition

    body = exposition(_registry(request, ctx), caller=caller)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
