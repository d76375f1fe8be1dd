"""A node's roles under one ExitStack: the listener of other nodes, the store's first-start
bootstrap, the executor, the presence and handoff loops every node runs, the scheduler and
housekeeping, the alert loop on api and scheduler nodes, and on executor nodes whose blobs go
to a bucket, the object store's upkeep. Each start registers its stop on the stack at once, so
a start that fails stops whatever started before it, and a node's end stops them in reverse
(as APScheduler's schedulers compose their services). The api role is the routes that
floom/api/app.py mounts; its app runs a Node for its lifespan."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from floom.config import Settings
from floom.engine.executor import Executor, interrupt_on_signal
from floom.engine.loops.alerts import AlertLoop
from floom.engine.loops.handoffs import HandoffLoop
from floom.engine.loops.heap import limit_arenas
from floom.engine.loops.housekeeping import Housekeeping
from floom.engine.loops.presence import NodePresence
from floom.engine.loops.scheduler import Scheduler
from floom.engine.loops.uploads import ObjectUploads
from floom.engine.runtime import NodeRuntime, listening
from floom.engine.work_root import hold_work_root
from floom.sandbox import backend_readiness, get_sandbox
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
    from floom.agent.runner import run_agent

    return run_agent(attempt)


class Node:
    """One node's roles, as its settings name them, while `running`."""

    def __init__(self, settings: Settings, *, ctx: Context | None = None) -> None:
        self.settings = settings
        self.roles = settings.role_set
        self._given_ctx = ctx
        # Set while running: the context and runtime its roles share, and the roles that
        # the health check reports on.
        self.ctx: Context | None = ctx
        self.runtime: NodeRuntime | None = None
        self.executor: Executor | None = None
        self.scheduler: Scheduler | None = None
        # The executor's sandbox protections and the backends' readiness (health check).
        self.protections: Any = None
        self.sandboxes: Any = None

    @contextmanager
    def running(self) -> Iterator[Node]:
        """Start the roles in order and stop them in reverse when the block ends; when a
        start fails, the ones started before it are stopped and the error goes on."""
        with ExitStack() as stack:
            self._start(stack)
            yield self

    def _start(self, stack: ExitStack) -> None:
        settings, roles = self.settings, self.roles
        # Before the node's threads start: they share two malloc arenas (engine/loops/heap.py).
        limit_arenas()
        ctx = self._given_ctx
        if ctx is None:
            ctx = Context.open(settings)
            stack.callback(ctx.engine.dispose)
        self.ctx = ctx
        runtime = self.runtime = NodeRuntime.of(ctx)
        # First, so that this node hears other nodes' revocations and queued runs at once.
        stack.enter_context(listening(ctx, runtime))
        bootstrap_store(ctx)
        executor = None
        if "executor" in roles:
            sandbox = get_sandbox(settings.sandbox, settings)
            sandbox.check()
            self.protections = sandbox.protections()
            self.sandboxes = backend_readiness(settings)
            executor = Executor(ctx, sandbox, run_agent=run_agent_attempt)
        # Before the executor starts, so that it stops after the executor's drain: a
        # draining node is still present.
        presence = NodePresence(
            ctx,
            slots=executor.slots if executor else None,
            in_use=executor.active_count if executor else lambda: 0,
            warm=executor.warm_stats if executor else lambda: None,
        )
        presence.start()
        stack.callback(presence.stop)
        if executor is not None and settings.blob_store != "database":
            # Before the executor, so that it stops after the executor's drain: the ends
            # recorded while draining still move their logs to the bucket.
            uploads = ObjectUploads(ctx)
            uploads.start()
            stack.callback(uploads.stop)
        if executor is not None:
            executor.start()
            stack.callback(_drain, executor)
            self.executor = executor
        handoffs = HandoffLoop(ctx, bridge="executor" in roles)
        handoffs.start()
        stack.callback(handoffs.stop)
        if "scheduler" in roles:
            scheduler = Scheduler(ctx)
            scheduler.start()
            stack.callback(scheduler.stop)
            self.scheduler = scheduler
            housekeeping = Housekeeping(ctx)
            housekeeping.start()
            stack.callback(housekeeping.stop)
        if roles & {"api", "scheduler"}:
            # Every such node watches (events count once by their keys, deliveries go out
            # under a lease): the dead-man's switch holds while any of them lives.
            alerts = AlertLoop(ctx)
            alerts.start()
            stack.callback(alerts.stop)


def _drain(executor: Executor) -> None:
    with interrupt_on_signal(executor):
        executor.stop()
