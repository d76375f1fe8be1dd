"""What every service call needs: settings, the database engine and the secret box."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from floom.config import Settings, mask_password
from floom.errors import StoreUnavailable
from floom.services.access.auth_cache import AuthCache
from floom.services.access.secrets import SecretBox
from floom.services.runs.waits import RunEnds
from floom.store.db import is_postgres, make_engine
from floom.store.migrate import migrate

if TYPE_CHECKING:
    from floom.services.runs.records import RunRecord
    from floom.store.models import Run, Version


class StartedRun(Protocol):
    """A run started ahead by LocalSlots.start_ahead."""

    def discard(self) -> None:
        """End it, its command never run."""
        ...


class LocalSlots(Protocol):
    """This node's executor, as the queue's writers see it: a run queued while it has a free
    slot is taken in the queueing transaction and started here at once, instead of being
    queued for its dispatcher to claim in a transaction of its own (floom/engine/executor.py
    implements it)."""

    def reserve(self) -> bool:
        """Hold a free slot for a run about to be queued; False when none is free (or the
        node is draining). A held slot is then either started (`start_claimed`) or `release`d."""
        ...

    def start_ahead(self, run: Run, version: Version) -> StartedRun | None:
        """Start `run`, about to be queued as claimed by this node in the slot held for it,
        up to its sandbox's command, which waits: the sandbox's start then overlaps the
        queueing transaction. None when it cannot. What it returns goes to `start_claimed`
        once the run is committed as claimed here, and is discarded otherwise."""
        ...

    def start_claimed(self, run: Run, ahead: StartedRun | None = None) -> None:
        """Run `run`, committed as claimed by this node, in the slot held for it (from
        `ahead` when it was started ahead)."""
        ...

    def release(self) -> None:
        """Give back a held slot: the run was queued for any node after all, or not at all."""
        ...


@dataclass
class Context:
    settings: Settings
    engine: Engine
    secret_box: SecretBox
    node_id: str
    # Set whenever this process queues a run, so a local executor starts it at once.
    run_queued: threading.Event = field(default_factory=threading.Event)
    # Runs cancelled through this process, so a local executor kills them without waiting
    # for its next look at the database.
    local_cancels: set[str] = field(default_factory=set)
    # Notified whenever this process records a run's end, so its waiters here wake at once
    # (floom/services/runs/waits.py); also counts each API key's open waits.
    run_ends: RunEnds = field(default_factory=RunEnds)
    # Builds the model provider of the agent runs this process executes (a ProviderFactory,
    # floom/agent/provider.py); None means the configured one. Tests put an in-memory
    # provider here. Typed loosely so that services need not import the agent package.
    provider_factory: Callable[[Settings], Any] | None = None
    # Keys this node authenticated lately; trusted only while revocations reach it at once
    # (floom/services/access/auth_cache.py), so a context built by hand caches nothing.
    auth_cache: AuthCache = field(default_factory=lambda: AuthCache(trusted=False))
    # This node's executor while it runs (None on a node without the executor role).
    local_slots: LocalSlots | None = None

    def notify_run_ended(self, run_id: str, record: RunRecord | None = None) -> None:
        self.run_ends.notify(run_id, record)

    @classmethod
    def open(cls, settings: Settings) -> Context:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(settings.data_dir, 0o700)
        engine = make_engine(settings.resolved_database_url)
        try:
            migrate(engine)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise StoreUnavailable(
                f"cannot open the database {mask_password(settings.resolved_database_url)}: "
                f"{type(getattr(exc, 'orig', None) or exc).__name__}",
                hint="check FLOOM_DATABASE_URL and that the database server is running",
            ) from exc
        return cls(
            settings=settings,
            engine=engine,
            secret_box=SecretBox.from_settings(settings),
            node_id=settings.node_id or _stable_node_id(settings),
            # On PostgreSQL the node's signal listener trusts the cache once it listens.
            auth_cache=AuthCache(trusted=not is_postgres(engine)),
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
