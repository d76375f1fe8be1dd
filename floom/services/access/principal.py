"""Who is calling a service: the caller's API key reduced to what services decide with (its
id, name, scopes and agent), or floom itself, and the one rule for what a scope allows.

Every surface (REST, the `/mcp` tools, the UI, webhooks) builds a Principal from the key it
was given and passes it keyword-only as `caller=`; the service calls `caller.require(scope)`
before it reads or changes anything, so a refusal changes nothing.

The key a Principal was built from may have been read moments ago, from a node's cache
(floom/services/access/auth_cache.py). A privileged write (deploy or admin scope) therefore asks
again inside its own transaction, with `caller.require_in(s, scope)`: a key revoked before
that transaction is refused and the write changes nothing, whatever any cache said.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlmodel import col

from floom.errors import Forbidden, Unauthorized
from floom.hints import KeyWith, act, told
from floom.hints import Surface as Surface  # where a call came in (the hints name its terms)
from floom.store.db import Writer, on_postgres
from floom.store.models import ApiKey
from floom.vocabulary import Scope

SCOPES: tuple[str, ...] = tuple(Scope)
# Each scope includes the ones before it: a deploy key can also run and read.
_RANK: dict[str, int] = {scope: i for i, scope in enumerate(SCOPES)}


def grants(key_scopes: str | Iterable[str], needed: str) -> bool:
    """Whether scopes (a list, or the comma-joined form stored with a key) include `needed`."""
    scopes = key_scopes.split(",") if isinstance(key_scopes, str) else key_scopes
    return any(_RANK.get(s, -1) >= _RANK[needed] for s in scopes)


@dataclass(frozen=True)
class Principal:
    """The caller of a service. `system` principals are floom itself (the scheduler,
    webhooks, the executor, start-up), which may do anything and are named by `name`."""

    key_id: str | None
    name: str
    scopes: tuple[str, ...]
    agent_id: str | None = None
    system: bool = False
    surface: Surface = "rest"

    def __post_init__(self) -> None:
        unknown = [s for s in self.scopes if s not in _RANK]
        if unknown:
            raise ValueError(f"unknown scope(s) {unknown}")
        if not self.system and self.key_id is None:
            raise ValueError("a principal that is not floom itself needs a key id")

    @classmethod
    def of_key(cls, key: ApiKey, *, surface: Surface = "rest") -> Principal:
        return cls(
            key_id=key.id,
            name=key.name or f"{key.prefix}...",
            scopes=tuple(s for s in key.scopes.split(",") if s in _RANK),
            agent_id=key.agent_id,
            surface=surface,
        )

    @property
    def actor(self) -> str | None:
        """Who acted, as runs and log lines record it: the key id; for floom itself, what
        it acted for (a label or an agent id), or None for plain floom."""
        return self.key_id or self.agent_id or self.name or None

    def describe(self) -> str:
        return self.name or self.key_id or "floom"

    def can(self, scope: str) -> bool:
        return self.system or grants(self.scopes, scope)

    def require(self, scope: str) -> None:
        """Raise Forbidden (naming the scope needed) unless this caller holds `scope`."""
        if not self.can(scope):
            raise self._lacks(scope)

    def _lacks(self, scope: str) -> Forbidden:
        # Each surface says how its caller gets such a key and uses it (floom.hints).
        hint = told("use ", KeyWith(scope))
        return Forbidden(
            f"this API key lacks the '{scope}' scope",
            hint=hint,
            details={"scope_needed": scope},
        )

    def require_in(self, s: Writer, scope: str) -> None:
        """`require(scope)`, then, inside the write transaction `s`, the caller's key read
        again: it must still exist, be unrevoked and hold `scope`. Raises Unauthorized for
        a key revoked (or deleted) since the request authenticated, Forbidden for a scope
        no longer held; the write's transaction then rolls back and changes nothing.

        On PostgreSQL the key row is read `FOR SHARE`: a revocation being committed now
        is waited for and seen, and a revocation that starts after this read waits for
        the write to commit (the write came first). On SQLite the write transaction holds
        the database's write lock from its BEGIN, so no revocation commits meanwhile.
        Cost: one primary-key read per privileged write. floom itself (`system`) passes.
        """
        self.require(scope)
        if self.system:
            return
        # On a session, its connection: the ORM's execute path costs more than the read.
        conn = s if isinstance(s, Connection) else s.connection()
        row = conn.execute(_key_statement(on_postgres(s)), {"key_id": self.key_id}).first()
        if row is None or row.revoked_at is not None:
            raise Unauthorized(
                "the API key is not valid or was revoked; nothing was changed",
                hint=told("use a valid key; ", act("keys list"), " on the server shows the keys"),
            )
        if not grants(row.scopes, scope):
            raise self._lacks(scope)


@lru_cache(maxsize=2)
def _key_statement(share_lock: bool) -> Any:
    """The caller's key, as require_in reads it (built once: building it costs more than
    running it on SQLite)."""
    query = select(col(ApiKey.scopes), col(ApiKey.revoked_at)).where(
        col(ApiKey.id) == bindparam("key_id")
    )
    return query.with_for_update(read=True) if share_lock else query


def system(name: str = "", *, agent_id: str | None = None) -> Principal:
    """floom acting on its own (a schedule fire, a webhook delivery, start-up, the executor);
    `name` says for what (e.g. "examples"), and is recorded as the actor."""
    return Principal(
        key_id=None, name=name, scopes=("admin",), agent_id=agent_id, system=True, surface="system"
    )


SYSTEM = system()
