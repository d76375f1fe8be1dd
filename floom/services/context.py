"""What every service call needs: settings, the database engine, the secret box, the node's
id, and the node itself as the domain sees it (NodeHooks: the one seam to the node)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from floom.config import Settings, mask_password
from floom.errors import StoreUnavailable
from floom.services.access.auth_cache import AuthCache
from floom.services.access.secrets import SecretBox
from floom.services.runs.waits import RunEnds
from floom.store.db import database_clock, is_postgres, make_engine
from floom.store.migrate import migrate

if TYPE_CHECKING:
    from floom.services.runs.records import RunRecord
    from floom.store.models import Run, RunEvent, Version


class NodeHooks:
    """The node a service call runs on, as the domain sees it: what the domain tells the node
    (a run queued, cancelled or ended) and the one thing it asks of it (a free slot for a run
    being queued). The domain never imports the node: a running node's roles share a
    NodeRuntime (floom/engine/runtime.py) that extends this class and that the node puts on
    its Context; `services` calls only these methods, never the engine.

    This base is a process that runs no node roles (a CLI command on the store, a context
    built by hand): nobody here to wake, no slot to offer, and keys cached only once a
    listener of revocations trusts the cache. Its waiters still wake at the ends recorded
    in this process.
    """

    def __init__(self, *, auth_cache: AuthCache | None = None) -> None:
        # Notified whenever this process records a run's end, so its waiters here wake at
        # once (floom/services/runs/waits.py); also counts each API key's open waits.
        self.run_ends = RunEnds()
        # Keys this node authenticated lately; trusted only while revocations reach it at
        # once (floom/services/access/auth_cache.py), so a context built by hand caches
        # nothing.
        self.auth_cache = auth_cache or AuthCache(trusted=False)

    def run_queued(self) -> None:
        """A run became claimable (committed): a local dispatcher looks at the queue now."""

    def executes_runs(self) -> bool:
        """Whether this process runs an executor now: a run it queues has one to start it
        (without asking the store which nodes are live)."""
        return False

    def run_cancelled(self, run_id: str) -> None:
        """`run_id` was cancelled through this process (committed): its attempt here is
        killed without waiting for the executor's next look at the database, and its
        waiters here wake."""
        self.run_ends.notify(run_id)

    def run_ended(
        self, run_id: str, record: RunRecord | None = None, *, log_moved: bool = False
    ) -> None:
        """This process recorded the end of `run_id` (committed; `record` as it left it;
        `log_moved`: its log is in its object already, none of its lines in run_events)."""
        self.run_ends.notify(run_id, record, log_moved=log_moved)

    def lines_stored(self, run_id: str, lines: Sequence[RunEvent]) -> None:
        """`run_id`, claimed here by its queueing transaction (in the slot `slot_for` held),
        was stored with `lines`, all its lines (committed): its attempt keeps a copy of them,
        so that its end need not read them back (engine/runlog.RunLog.kept)."""

    def slot_for(
        self, run: Run, version: Version, *, start_ahead: bool
    ) -> AbstractContextManager[bool]:
        """Around the transaction that queues `run`: True when a free slot of this node's
        executor is held for it, so the transaction may insert it as claimed by this node
        (run_rules.mark_claimed) instead of leaving it for a dispatcher's claim. When the
        block ends without an error and `run` is claimed by this node, the run starts in
        that slot; otherwise the slot is given back. With `start_ahead` the run's sandbox
        may start while the transaction commits (floom/engine/dispatch.py)."""
        return nullcontext(False)


@dataclass
class Context:
    """The first argument of every service call. It holds what the domain's rules need, and
    of the node only its id and its NodeHooks: the node's runtime (the dispatcher's wake-up,
    local cancels, slots, the model provider) lives in floom/engine/runtime.py."""

    settings: Settings
    engine: Engine
    secret_box: SecretBox
    node_id: str
    # The node these calls run on (NodeHooks above); a running node puts its runtime here.
    node: NodeHooks = field(default_factory=NodeHooks)

    @classmethod
    def open(cls, settings: Settings) -> Context:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(settings.data_dir, 0o700)
        engine = make_engine(
            settings.resolved_database_url,
            lock_timeout_seconds=settings.lock_timeout_seconds,
            idle_in_transaction_seconds=settings.idle_in_transaction_seconds,
        )
        try:
            migrate(engine)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise StoreUnavailable(
                f"cannot open the database {mask_password(settings.resolved_database_url)}: "
                f"{type(getattr(exc, 'orig', None) or exc).__name__}",
                hint="check FLOOM_DATABASE_URL and that the database server is running",
            ) from exc
        with contextlib.suppress(StoreUnavailable):
            # Read now, outside any transaction: later readings are refreshed aside.
            database_clock(engine).refresh()
        return cls(
            settings=settings,
            engine=engine,
            secret_box=SecretBox.from_settings(settings),
            node_id=settings.node_id or _stable_node_id(settings),
            # On PostgreSQL the node's signal listener trusts the cache once it listens.
            node=NodeHooks(auth_cache=AuthCache(trusted=not is_postgres(engine))),
        )


def _stable_node_id(settings: Settings) -> str:
    """One id per host and data dir, kept across restarts, so a restarted node can reclaim
    its own abandoned runs at once instead of waiting for their leases to expire."""
    path = settings.data_dir / "node.id"
    if path.exists():
        return path.read_text().strip()
    node = f"{socket.gethostname()[:40]}-{os.urandom(4).hex()}"
    path.write_text(node)
    return node
