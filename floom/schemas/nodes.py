"""The nodes of a cluster, as answered by GET /api/v1/nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from floom.schemas.common import NodeStateWord, Public, Timestamp

if TYPE_CHECKING:
    from floom.services.ops.nodes import NodeView


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
    )
