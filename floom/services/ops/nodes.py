"""The nodes of a cluster: registration at start, heartbeats, a clean stop, and the list
with each node's state (live, lost when silent past its lease, stopped)."""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select as core_select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import col, delete, select, update

from floom import __version__
from floom.hints import act, told
from floom.hints import cli as cli_hints
from floom.services.access.principal import Principal
from floom.store.db import (
    database_clock,
    database_now,
    db_now,
    session_scope,
    write_connection,
)
from floom.store.models import utcnow
from floom.store.nodes import Node
from floom.vocabulary import NodeState

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.store.db import Reader

# Rows of nodes gone this long are dropped when a node registers, so the list stays about
# the cluster as it is, not every container that ever ran.
FORGET_AFTER = timedelta(days=1)
# What a run queued while no executor is live says in its log, and `floom doctor` on a node
# without the role when none is live either.
NO_EXECUTOR = "no live floom node has the executor role"
START_EXECUTOR = told(
    "start one with ",
    act("serve", roles="executor"),
    ", or, with docker compose, choose a profile (COMPOSE_PROFILES=bwrap or e2b)",
)
# Stored in the run's log as the CLI writes it; each surface reads it back in its terms.
QUEUED_WITHOUT_EXECUTOR = (
    f"{NO_EXECUTOR}, so no node can run this run now: it waits in the queue until one "
    f"starts; {cli_hints.written(START_EXECUTOR)}"
)
# A live executor seen this recently is believed still there without asking the store again:
# an api node queueing a burst reads the nodes table once, not once a run.
_BELIEVED_FOR = 2.0
_executor_seen: dict[int, float] = {}


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
        row.heard_at = database_now(s)
        row.stopped_at = None
        row.warm = None
        s.add(row)


def heartbeat(ctx: Context, *, slots_in_use: int, warm: str | None = None) -> None:
    """Renew this node's row, with its warm pools as JSON (bounded by
    schemas.nodes.warm_row); a row another node pruned meanwhile stays gone. One UPDATE:
    every node sends it every FLOOM_HEARTBEAT_SECONDS, idle or not (it read the row first)."""
    with write_connection(ctx.engine) as c:
        c.execute(
            update(Node)
            .where(col(Node.id) == ctx.node_id)
            .values(
                heartbeat_at=utcnow(),
                heard_at=db_now(),
                slots_in_use=slots_in_use,
                stopped_at=None,
                warm=warm,
            )
        )


def mark_stopped(ctx: Context) -> None:
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Node, ctx.node_id)
        if row is not None:
            row.stopped_at = utcnow()
            row.slots_in_use = 0
            row.warm = None
            s.add(row)


def executor_live(ctx: Context, s: Reader) -> bool:
    """Whether some node can run queued runs now: this node executes, or another node with
    the executor role is live (its heartbeat within its lease, not stopped)."""
    if "executor" in ctx.settings.role_set:
        return True
    key = id(ctx.engine)
    if time.monotonic() - _executor_seen.get(key, -math.inf) < _BELIEVED_FOR:
        return True
    live = live_executors(s) > 0
    if live:
        _executor_seen[key] = time.monotonic()
    return live


def live_executors(s: Reader) -> int:
    """How many nodes with the executor role are live: not stopped, heard within their
    lease."""
    now = database_clock(s if isinstance(s, Connection) else s.get_bind()).earliest()
    rows = s.execute(
        core_select(
            col(Node.roles), col(Node.heartbeat_at), col(Node.heard_at), col(Node.lease_seconds)
        ).where(col(Node.stopped_at).is_(None))
    ).all()
    return sum(
        executes(roles) and _heard_within(heard_at or heartbeat_at, lease_seconds, now=now)
        for roles, heartbeat_at, heard_at, lease_seconds in rows
    )


def executes(roles: str) -> bool:
    """Whether a node's roles (as its row stores them, comma-separated) include executor."""
    return "executor" in {r.strip() for r in roles.split(",")}


def _heard_within(heard_at: datetime, lease_seconds: float, *, now: datetime) -> bool:
    """The one rule of a live node: its last heartbeat is within its lease, both on the
    database's clock (heard_at; `now` from database_clock): a node whose own clock is off is
    neither lost while it beats nor live after it stopped."""
    return (now - heard_at).total_seconds() <= lease_seconds


def state_of(node: Node, *, now: datetime) -> tuple[NodeState, float]:
    """The node's state and how long it has been silent, `now` on the database's clock."""
    heard = node.heard_at or node.heartbeat_at  # a row from before heard_at has none
    silent = max(0.0, (now - heard).total_seconds())
    if node.stopped_at is not None:
        return NodeState.STOPPED, silent
    live = _heard_within(heard, node.lease_seconds, now=now)
    return (NodeState.LIVE if live else NodeState.LOST), silent


# What a queued run's answers say (REST, the CLI, MCP, its page) while no executor is live.
RUN_CANNOT_START = told(
    f"{NO_EXECUTOR}, so no node can run it: it waits in the queue until one starts; ",
    *START_EXECUTOR.parts,
)


def live_nodes(engine: Engine) -> list[Node]:
    """The nodes of the store at `engine` that renew their rows, by id."""
    now = database_clock(engine).earliest()
    with session_scope(engine) as s:
        rows = s.exec(select(Node).where(col(Node.stopped_at).is_(None))).all()
    return sorted(
        (n for n in rows if state_of(n, now=now)[0] == NodeState.LIVE), key=lambda n: n.id
    )


def runs_runs(node: Node) -> bool:
    """Whether the node has the executor role."""
    return executes(node.roles)


def live_executor_ids(ctx: Context) -> list[str]:
    """The ids of the live nodes that run runs (the executor role): none means queued runs
    wait until one starts. Read by any caller that may see a run: it says only whether."""
    return [n.id for n in live_nodes(ctx.engine) if runs_runs(n)]


def list_nodes(ctx: Context, *, caller: Principal) -> list[NodeView]:
    """Every node seen within FORGET_AFTER, live ones first, each group by id. Needs the read
    scope."""
    caller.require("read")
    now = database_clock(ctx.engine).earliest()
    with session_scope(ctx.engine) as s:
        rows = s.exec(select(Node).where(col(Node.heartbeat_at) >= now - FORGET_AFTER)).all()
    views = [NodeView(node, *state_of(node, now=now)) for node in rows]
    order = {state: i for i, state in enumerate(NodeState)}
    return sorted(views, key=lambda v: (order[v.state], v.node.id))
