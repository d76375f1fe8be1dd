"""Who is calling a service: the caller's API key reduced to what services decide with (its
id, name, scopes and agent), or floom itself, and the one rule for what a scope allows.

Every surface (REST, the `/mcp` tools, the UI, webhooks) builds a Principal from the key it
was given and passes it keyword-only as `caller=`; the service calls `caller.require(scope)`
before it reads or changes anything, so a refusal changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from floom.errors import Forbidden
from floom.store.models import ApiKey

SCOPES = ("read", "run", "deploy", "admin")
# Each scope includes the ones before it: a deploy key can also run and read.
_RANK = {scope: i for i, scope in enumerate(SCOPES)}

# Where a call came in, so that refusals and hints can name what that caller can use.
Surface = Literal["rest", "cli", "mcp", "ui", "system"]


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
        if self.can(scope):
            return
        if self.surface == "mcp":
            hint = (
                f"this MCP client's API key needs the '{scope}' scope (or higher); "
                "configure the client with such a key"
            )
        elif self.surface == "ui":
            hint = f"sign in with an API key that has the '{scope}' scope (or higher)"
        else:
            hint = f"use a key created with `floom keys create --scope {scope}` (or higher)"
        raise Forbidden(
            f"this API key lacks the '{scope}' scope",
            hint=hint,
            details={"scope_needed": scope},
        )


def system(name: str = "", *, agent_id: str | None = None) -> Principal:
    """floom acting on its own (a schedule fire, a webhook delivery, start-up, the executor);
    `name` says for what (e.g. "examples"), and is recorded as the actor."""
    return Principal(
        key_id=None, name=name, scopes=("admin",), agent_id=agent_id, system=True, surface="system"
    )


SYSTEM = system()
