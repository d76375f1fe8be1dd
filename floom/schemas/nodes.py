"""The nodes of a cluster, as answered by GET /api/v1/nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from floom.schemas.common import NodeStateWord, Public, Timestamp
from floom.schemas.health import WarmHealth
from floom.vocabulary import NodeState

if TYPE_CHECKING:
    from floom.services.ops.nodes import NodeView

# The most a node's warm pools take in its row: past it, the pools are dropped and the totals
# kept (a node would need hundreds of pools to reach it).
WARM_BYTES = 32 * 1024


class NodePublic(Public):
    id: str
    state: NodeStateWord = Field(
        description="lost: silent for longer than its lease (its runs are requeued by then); "
        "stopped: shut down cleanly"
    )
    roles: list[str]
    version: str
    hostname: str
    slots: int | None = Field(description="executor slots; None on a node without the executor")
    slots_in_use: int
    started_at: Timestamp
    heartbeat_at: Timestamp
    silent_seconds: float = Field(description="seconds since its last heartbeat")
    lease_seconds: float
    warm: WarmHealth | None = Field(
        None,
        description="its warm pools as its last heartbeat saw them (the shape of /healthz's "
        "`warm`); None on a node without warm starts or stopped",
    )


class NodeList(Public):
    items: list[NodePublic]


def node_public(view: NodeView) -> NodePublic:
    node = view.node
    return NodePublic(
        id=node.id,
        state=view.state,
        roles=[r for r in node.roles.split(",") if r],
        version=node.version,
        hostname=node.hostname,
        slots=node.slots,
        slots_in_use=node.slots_in_use,
        started_at=node.started_at,
        heartbeat_at=node.heartbeat_at,
        silent_seconds=round(view.silent_seconds, 3),
        lease_seconds=node.lease_seconds,
        warm=warm_of_row(node.warm) if view.state != NodeState.STOPPED else None,
    )


def warm_row(stats: dict[str, Any] | None) -> str | None:
    """A node's warm pools (Executor.warm_stats) as its row keeps them: JSON of at most
    WARM_BYTES, the pools dropped past it (the totals kept)."""
    if stats is None:
        return None
    health = WarmHealth.model_validate(stats)
    text = health.model_dump_json()
    if len(text) > WARM_BYTES:
        e2b = health.e2b.model_copy(update={"pools": []}) if health.e2b else None
        text = health.model_copy(update={"pools": [], "e2b": e2b}).model_dump_json()
    return text


def warm_of_row(text: str | None) -> WarmHealth | None:
    """A node row's warm pools; None when it holds none, or holds what no node writes (too
    long, not the shape): a bad row shows as no pools, never breaks the list."""
    if not text or len(text) > WARM_BYTES:
        return None
    try:
        return WarmHealth.model_validate_json(text)
    except ValidationError:
        return None
