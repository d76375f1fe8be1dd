"""The nodes of a cluster: registration at start, heartbeats, a clean stop, and the list
with each node's state (live, lost when silent past its lease, stopped)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from sqlmodel import col, delete, select

from floom import __version__
from floom.services.access.principal import Principal
from floom.store.db import session_scope
from floom.store.models import utcnow
from floom.store.nodes import Node

if TYPE_CHECKING:
    from floom.services.context import Context

NodeState = Literal["live", "lost", "stopped"]
# Rows of nodes gone this long are dropped when a node registers, so the list stays about
# the cluster as it is, not every container that ever ran.
FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class NodeView:
    node: Node
    state: NodeState
    silent_seconds: float


def register(ctx: Context, *, slots: int | None) -> None:
    """Record this node as started now (a restart keeps its row and its id)."""
    now = utcnow()
    with session_scope(ctx.engine, write=True) as s:
        gone = delete(Node).where(col(Node.heartbeat_at) < now - FORGET_AFTER)
        s.exec(gone)
        row = s.get(Node, ctx.node_id)
        if row is None:
            row = Node(id=ctx.node_id, lease_seconds=0, roles="", version="")
        row.roles = ctx.settings.roles
        row.version = __version__
        row.hostname = socket.gethostname()[:255]
        row.lease_seconds = ctx.settings.lease_seconds
        row.slots = slots
        row.slots_in_use = 0
        row.started_at = now
        row.heartbeat_at = now
        row.stopped_at = None
        s.add(row)


def heartbeat(ctx: Context, *, slots_in_use: int) -> None:
    """Renew this node's row; registers it again if another node pruned it meanwhile."""
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Node, ctx.node_id)
        if row is None:
            return
        row.heartbeat_at = utcnow()
        row.slots_in_use = slots_in_use
        row.stopped_at = None
        s.add(row)


def mark_stopped(ctx: Context) -> None:
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Node, ctx.node_id)
        if row is not None:
            row.stopped_at = utcnow()
            row.slots_in_use = 0
            s.add(row)


def state_of(node: Node, *, now: datetime) -> tuple[NodeState, float]:
    silent = max(0.0, (now - node.heartbeat_at).total_seconds())
    if node.stopped_at is not None:
        return "stopped", silent
    return ("lost" if silent > node.lease_seconds else "live"), silent


def list_nodes(ctx: Context, *, caller: Principal) -> list[NodeView]:
    """Every node seen within FORGET_AFTER, live ones first, each group by id. Needs the read
    scope."""
    caller.require("read")
    now = utcnow()
    with session_scope(ctx.engine) as s:
        rows = s.exec(select(Node).where(col(Node.heartbeat_at) >= now - FORGET_AFTER)).all()
    views = [NodeView(node, *state_of(node, now=now)) for node in rows]
    order = {"live": 0, "lost": 1, "stopped": 2}
    return sorted(views, key=lambda v: (order[v.state], v.node.id))
