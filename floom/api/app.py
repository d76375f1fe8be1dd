"""The FastAPI application: one process can serve the API and run the executor."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from sqlalchemy import text

from floom import __version__
from floom.api import errors, metrics, openapi
from floom.api.address_limit import AddressRateLimit
from floom.api.body_limit import BodyLimitMiddleware
from floom.api.forwarded import ForwardedHeaders
from floom.api.mcp_mount import LazyMCPMount
from floom.api.routes import admin as routes_admin
from floom.api.routes import agents as routes_agents
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
from floom.engine.executor import Executor, interrupt_on_signal
from floom.engine.loops.handoffs import HandoffLoop
from floom.engine.loops.heap import limit_arenas
from floom.engine.loops.housekeeping import Housekeeping
from floom.engine.loops.presence import NodePresence
from floom.engine.loops.scheduler import Scheduler
from floom.engine.work_root import hold_work_root
from floom.sandbox import backend_readiness, get_sandbox
from floom.schemas.health import ExecutorHealth, Health
from floom.services import wakeups
from floom.services.access import keys, principal
from floom.services.context import Context
from floom.services.workers import versions as workers
from floom.services.workers.examples import deploy_examples
from floom.store.db import BOOTSTRAP_LOCK, cluster_lock

if TYPE_CHECKING:
    from floom.engine.attempt import Attempt
    from floom.engine.queue import Outcome

log = logging.getLogger("floom")


def preflight(settings: Settings) -> Context:
    """Open the store and check the sandbox before serving, so a broken setup fails with a
    clear error and hint instead of a traceback from inside the server's start-up."""
    if "executor" in settings.role_set:
        get_sandbox(settings.sandbox, settings).check()
        hold_work_root(settings.data_dir)  # held until the executor stops
    return Context.open(settings)


def _has_worker(ctx: Context) -> bool:
    rows, _ = workers.list_workers(ctx, limit=1, caller=principal.SYSTEM)
    return bool(rows)


def bootstrap_store(ctx: Context) -> None:
    """First start of a store: the admin key, then the example workers. Nodes starting at
    once take turns, so a cluster gets one admin key and one set of example versions."""
    settings = ctx.settings
    with cluster_lock(ctx.engine, BOOTSTRAP_LOCK):
        new_key = keys.ensure_admin_key(ctx)
        if new_key:
            print(
                f"floom: created the admin API key (shown once; also saved to "
                f"{settings.admin_key_file}):\n  {new_key}",
                file=sys.stderr,
                flush=True,
            )
        if settings.deploy_examples and not _has_worker(ctx):
            names = deploy_examples(ctx)
            if names:
                log.info("deployed example workers: %s", ", ".join(names))


def run_agent_attempt(attempt: Attempt) -> Outcome:
    """The executor's agent runner (floom.agent.runner.run_agent). Imported on first use, at
    the first agent run: the agent package with httpx costs a node about 5 MiB resident that
    a node running only scripts never needs."""
    from floom.agent.runner import run_agent  # noqa: PLC0415

    return run_agent(attempt)


def create_app(settings: Settings | None = None, *, ctx: Context | None = None) -> FastAPI:
    settings = settings or (ctx.settings if ctx else Settings())
    roles = settings.role_set

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before the node's threads start: they share two malloc arenas (engine/loops/heap.py).
        limit_arenas()
        context = ctx or Context.open(settings)
        app.state.ctx = context
        # First, so that this node hears other nodes' revocations and queued runs at once.
        listener = wakeups.start_listening(context)
        bootstrap_store(context)
        executor = None
        app.state.protections = None
        app.state.sandboxes = None
        if "executor" in roles:
            sandbox = get_sandbox(settings.sandbox, settings)
            sandbox.check()
            app.state.protections = sandbox.protections()
            app.state.sandboxes = backend_readiness(settings)
            executor = Executor(context, sandbox, run_agent=run_agent_attempt)
            executor.start()
        app.state.executor = executor
        presence = NodePresence(
            context,
            slots=executor.slots if executor else None,
            in_use=executor.active_count if executor else lambda: 0,
        )
        presence.start()
        handoffs = HandoffLoop(context, bridge="executor" in roles)
        handoffs.start()
        scheduler = Scheduler(context) if "scheduler" in roles else None
        if scheduler is not None:
            scheduler.start()
        app.state.scheduler = scheduler
        housekeeping = Housekeeping(context) if "scheduler" in roles else None
        if housekeeping is not None:
            housekeeping.start()
        try:
            if mcp_endpoint is None:
                yield
            else:
                async with mcp_endpoint.running():
                    yield
        finally:
            if housekeeping is not None:
                housekeeping.stop()
            if scheduler is not None:
                scheduler.stop()
            handoffs.stop()
            if executor is not None:
                with interrupt_on_signal(executor):
                    executor.stop()
            presence.stop()
            if listener is not None:
                listener.stop()
            if ctx is None:
                context.engine.dispose()

    app = FastAPI(
        title="floom",
        version=__version__,
        description="Self-hosted runtime for background AI workers.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.add_middleware(BodyLimitMiddleware, settings=settings)
    app.add_middleware(EncodedSlashGuard)
    # Added last, so run first: the client's address is settled before it is counted.
    app.add_middleware(AddressRateLimit, settings=settings)
    app.add_middleware(ForwardedHeaders, trusted=settings.forwarded_allow_ips)
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
        ):
            add_routes(app, router)
        mcp_endpoint = LazyMCPMount(app, settings)

    @app.get("/healthz", tags=["health"], response_model=Health, responses=openapi.errors(429, 503))
    def healthz() -> Health:
        context: Context = app.state.ctx
        with context.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        executor = app.state.executor
        return Health(
            status="ok",
            version=__version__,
            database=context.engine.dialect.name,
            node=context.node_id,
            roles=sorted(roles, key=ROLES.index),
            executor=None
            if executor is None
            else ExecutorHealth(slots=executor.slots, active=executor.active_count()),
            protections=app.state.protections,
            sandboxes=app.state.sandboxes,
            warm=None if executor is None else executor.sandbox.warm_stats(),
        )

    if "api" in roles:
        LazyUI(app)  # the web UI at /, last, so that every other route matches first
    return app
