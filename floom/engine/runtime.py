"""A node's runtime: what its roles share in one process (the dispatcher's wake-up, the runs
cancelled here, the run ends waited on here, the key cache, the model provider of its agent
runs, its executor's slots), and the listener that wakes it at other nodes' changes. The
domain sees it only as NodeHooks (floom/services/context.py); floom/node.py builds it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from floom.config import Settings
from floom.services.access.auth_cache import AuthCache
from floom.services.context import NodeHooks
from floom.services.wakeups import WAKEUPS
from floom.store import signals
from floom.store.db import is_postgres

if TYPE_CHECKING:
    from floom.engine.dispatch import Dispatch
    from floom.services.context import Context
    from floom.store.models import Run, RunEvent, Version

# Cancels heard for runs of any node; past this many the set starts over (a cancel lost
# that way still reaches its run at the executor's next heartbeat).
MAX_REMOTE_CANCELS = 10_000


class NodeRuntime(NodeHooks):
    """The NodeHooks of a running node."""

    def __init__(self, *, auth_cache: AuthCache | None = None) -> None:
        super().__init__(auth_cache=auth_cache)
        # Set whenever a run becomes claimable here or is heard of, so a local dispatcher
        # claims it at once instead of at its next poll.
        self.queued = threading.Event()
        # Runs cancelled through this process (or heard of), so a local executor kills them
        # without waiting for its next look at the database.
        self.local_cancels: set[str] = set()
        # Builds the model provider of the agent runs this node executes (a ProviderFactory,
        # floom/agent/provider.py); None means the configured one. Tests put an in-memory
        # provider here. Typed loosely: the engine does not import the agent package.
        self.provider_factory: Callable[[Settings], Any] | None = None
        # This node's executor while it runs (None on a node without the executor role).
        self.dispatch: Dispatch | None = None
        # Whether this node hears every signal now: its listener's last heartbeat came back
        # in time (floom/store/signals.py), so every run queued on any node wakes `queued`.
        # Never on SQLite or with FLOOM_SIGNALS off (another process may write unheard).
        self.signals_heard: Callable[[], bool] = lambda: False

    @classmethod
    def of(cls, ctx: Context) -> NodeRuntime:
        """The runtime of the node `ctx` serves. A context opened without one (a test's
        executor, a scheduler of its own) gets one now, keeping its waiters and key cache."""
        if not isinstance(ctx.node, NodeRuntime):
            runtime = cls(auth_cache=ctx.node.auth_cache)
            runtime.run_ends = ctx.node.run_ends
            ctx.node = runtime
        return ctx.node

    def run_queued(self) -> None:
        self.queued.set()

    def run_cancelled(self, run_id: str) -> None:
        self.local_cancels.add(run_id)
        super().run_cancelled(run_id)

    def executes_runs(self) -> bool:
        return self.dispatch is not None

    def lines_stored(self, run_id: str, lines: Sequence[RunEvent]) -> None:
        dispatch = self.dispatch
        if dispatch is not None:
            dispatch.lines_stored(run_id, lines)

    def slot_for(
        self, run: Run, version: Version, *, start_ahead: bool
    ) -> AbstractContextManager[bool]:
        dispatch = self.dispatch
        if dispatch is None:
            return super().slot_for(run, version, start_ahead=start_ahead)
        return dispatch.taking(run, version, start_ahead=start_ahead)

    def heard(self, channel: str, payload: str) -> None:
        """A signal of another node (floom/store/signals.py)."""
        if channel == signals.RUN_QUEUED:
            self.queued.set()
        elif channel == signals.RUN_CANCEL:
            if len(self.local_cancels) >= MAX_REMOTE_CANCELS:
                self.local_cancels.clear()
            self.local_cancels.add(payload)
        elif channel == signals.KEY_REVOKED:
            self.auth_cache.forget(payload)
        for wakeup in WAKEUPS:
            if channel == wakeup.channel:
                wakeup.notify()


@contextmanager
def listening(ctx: Context, runtime: NodeRuntime) -> Iterator[signals.Listener | None]:
    """This node's listener of other nodes' signals while the block runs (None on SQLite:
    one process, which wakes itself; and when FLOOM_SIGNALS is off)."""
    if not is_postgres(ctx.engine) or not ctx.settings.signals:
        yield None
        return
    cache = runtime.auth_cache

    def on_connect() -> None:
        # Whatever was signalled while away is lost: start from the database again. The key
        # cache is trusted once the first heartbeat on this connection comes back.
        cache.clear(trusted=False)
        runtime.queued.set()
        for wakeup in WAKEUPS:
            wakeup.notify()

    listener = signals.Listener(
        ctx.engine.url,
        on_signal=runtime.heard,
        on_connect=on_connect,
        on_disconnect=lambda: cache.clear(trusted=False),
        on_heard=cache.heard,
    )
    listener.start()
    runtime.signals_heard = lambda: listener.connected.is_set() and cache.trusted
    try:
        yield listener
    finally:
        runtime.signals_heard = lambda: False
        listener.stop()
