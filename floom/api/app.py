"""The FastAPI application: the api role's routes, and a node's other roles (floom/node.py)
run for its lifespan, so one process can serve the API and run the executor."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi_offline import FastAPIOffline

from floom import __version__
from floom.api import errors, metrics, openapi
from floom.api.address_limit import AddressRateLimit, HookFailureBudget
from floom.api.auth import bearer_token
from floom.api.draining import Drain, DrainingGuard
from floom.api.edge.bodies import BodyLimitMiddleware
from floom.api.forwarded import ForwardedHeaders
from floom.api.mcp_mount import LazyMCPMount
from floom.api.routes import admin as routes_admin
from floom.api.routes import agents as routes_agents
from floom.api.routes import alerts as routes_alerts
from floom.api.routes import approvals as routes_approvals
from floom.api.routes import audit as routes_audit
from floom.api.routes import handoffs as routes_handoffs
from floom.api.routes import hooks as routes_hooks
from floom.api.routes import nodes as routes_nodes
from floom.api.routes import replays as routes_replays
from floom.api.routes import runs as routes_runs
from floom.api.routes import triggers as routes_triggers
from floom.api.routes import workers as routes_workers
from floom.api.routing import EncodedSlashGuard, add_routes
from floom.api.ui_mount import LazyUI
from floom.config import ROLES, Settings
from floom.errors import FloomError
from floom.node import Node
from floom.schemas.health import ExecutorHealth, Health
from floom.services.access import keys
from floom.services.access.principal import grants
from floom.services.context import Context
from floom.services.ops import held_logs

#: Where /docs and /redoc load their assets from.
DOCS_ASSETS = "/docs/assets"


def create_app(settings: Settings | None = None, *, ctx: Context | None = None) -> FastAPI:
    settings = settings or (ctx.settings if ctx else Settings())
    roles = settings.role_set

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The node's roles first (floom/node.py), then the MCP endpoint; a failed start
        # stops whatever started before it, and the end stops them in reverse.
        async with AsyncExitStack() as stack:
            node = stack.enter_context(Node(settings, ctx=ctx).running())
            app.state.node = node
            app.state.ctx = node.ctx
            if mcp_endpoint is not None:
                await stack.enter_async_context(mcp_endpoint.running())
            yield

    # /docs (Swagger UI) and /redoc load their scripts and styles from the installed
    # fastapi-offline package, not a CDN, so the API reference works on a machine offline;
    # nor does Swagger UI send the document to its online validator for a badge.
    app = FastAPIOffline(
        title="floom",
        version=__version__,
        description="Self-hosted runtime for background AI workers.",
        lifespan=lifespan,
        static_url=DOCS_ASSETS,
        swagger_ui_parameters={"validatorUrl": None},
    )
    errors.install(app)
    # Failed signature checks at /hooks, per address and per hook (routes/hooks.py); past
    # them a sender is refused before its body is read (edge/bodies.py).
    app.state.hook_budget = HookFailureBudget(settings)
    app.add_middleware(BodyLimitMiddleware, settings=settings, hook_budget=app.state.hook_budget)
    app.add_middleware(EncodedSlashGuard)
    # Added last, so run first: the client's address is settled before it is counted.
    app.add_middleware(AddressRateLimit, settings=settings)
    app.add_middleware(ForwardedHeaders, trusted=settings.forwarded_allow_ips)
    # First of all: a draining node answers 503 to everything (floom/api/draining.py).
    app.state.drain = Drain()
    app.add_middleware(DrainingGuard, drain=app.state.drain, clock=time.monotonic)
    openapi.install(app)
    add_routes(app, metrics.router)
    mcp_endpoint: LazyMCPMount | None = None
    # A node without the api role answers /healthz and /metrics only: its port is for health
    # checks and monitoring.
    if "api" in roles:
        for router in (
            routes_workers.router,
            routes_runs.router,
            routes_replays.router,
            routes_admin.router,
            routes_audit.router,
            routes_agents.router,
            routes_handoffs.router,
            routes_approvals.router,
            routes_triggers.router,
            routes_hooks.router,
            routes_nodes.router,
            routes_alerts.router,
        ):
            add_routes(app, router)
        mcp_endpoint = LazyMCPMount(app, settings)

    @app.get("/healthz", tags=["health"], response_model=Health, responses=openapi.errors(429, 503))
    def healthz(request: Request) -> Health:
        context: Context = app.state.ctx
        # Also the database's check: one statement, on a partial index.
        held_back = held_logs.held_back_count(context.engine)
        node: Node = app.state.node
        executor = node.executor
        return Health(
            status="ok",
            version=__version__,
            database=context.engine.dialect.name,
            node=context.node_id,
            roles=sorted(roles, key=ROLES.index),
            held_back_run_logs=held_back,
            executor=None
            if executor is None
            else ExecutorHealth(slots=executor.slots, active=executor.active_count()),
            protections=node.protections,
            sandboxes=node.sandboxes,
            warm=None if executor is None else _warm_for(context, request, executor.warm_stats()),
        )

    if "api" in roles:
        LazyUI(app)  # the web UI at /, last, so that every other route matches first
    return app


def _warm_for(ctx: Context, request: Request, warm: dict[str, Any] | None) -> dict[str, Any] | None:
    """The warm starts /healthz tells `request`: each pool names a worker and its version,
    which only a caller with the read scope may learn; anyone (a load balancer) gets the
    totals."""
    if warm is None or _reads(ctx, request):
        return warm
    shown = {**warm, "pools": []}
    if isinstance(warm.get("e2b"), dict):
        shown["e2b"] = {**warm["e2b"], "pools": []}
    return shown


def _reads(ctx: Context, request: Request) -> bool:
    token = bearer_token(request)
    if not token:
        return False
    try:
        key = keys.authenticate(ctx, token)
    except FloomError:
        return False
    return grants(key.scopes, "read")
