"""The nodes table: each floom process that shares this store registers here and renews its
row on every heartbeat, so any node can list the cluster and see which nodes went silent."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Text
from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class Node(SQLModel, table=True):
    __tablename__ = "nodes"
    id: str = Field(primary_key=True, max_length=80)
    roles: str = Field(max_length=64)  # comma-separated, in floom.config.ROLES order
    version: str = Field(max_length=40)
    hostname: str = Field(default="", max_length=255)
    # The node's own lease: silent longer than this, it is shown as lost, as its runs are.
    lease_seconds: float
    slots: int | None = None  # executor slots; None on a node without the executor role
    slots_in_use: int = 0
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    heartbeat_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)
    # The same moment on the database's clock (floom/store/db.py, db_now): whether a node is
    # silent is judged by it, and how far its own clock is behind (what it writes is read
    # back that much further). None from a node older than it.
    heard_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    stopped_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Its warm pools as its last heartbeat saw them (schemas.health.WarmHealth as JSON,
    # bounded by services.ops.nodes.WARM_BYTES); None without warm starts.
    warm: str | None = Field(default=None, sa_column=Column(Text))
