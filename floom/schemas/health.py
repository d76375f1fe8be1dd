"""What /healthz answers: this node's state and the protections its sandboxes run under."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from floom.schemas.common import Public


class ExecutorHealth(Public):
    slots: int
    active: int


class WarmPool(Public):
    """One pool of warm processes: a worker version's ready and running children."""

    version: str
    worker: str
    ready: int
    running: int
    hits: int
    misses: int
    modules: int
    warm_processes_started: int
    rss_bytes: int


class E2BWarmPool(Public):
    """E2B sandboxes created ahead for one template and network setting."""

    template: str
    network: bool
    ready: int
    creating: int
    running: int
    hits: int
    misses: int
    replaced: int


class E2BWarmHealth(Public):
    """FLOOM_E2B_WARM's pools on this node."""

    enabled: bool
    count: int
    budget: int
    # Finite: a row holding NaN read back as null, which no client model takes.
    idle_seconds: float = Field(allow_inf_nan=False)
    hits: int
    misses: int
    pools: list[E2BWarmPool]


class WarmHealth(Public):
    enabled: bool
    pools: list[WarmPool]
    hits: int
    misses: int
    e2b: E2BWarmHealth | None = None


class Health(Public):
    status: Literal["ok"]
    version: str
    database: str = Field(description="the store's dialect: sqlite or postgresql")
    node: str
    roles: list[str] = Field(description="what this node does: api, scheduler, executor")
    executor: ExecutorHealth | None = Field(description="None on a node without the executor")
    protections: dict[str, Any] | None = Field(
        description="the sandbox protections active on this node (namespaces, uid, seccomp, "
        "cgroup limits, network); None on a node without the executor"
    )
    sandboxes: dict[str, str] | None = Field(
        None,
        description="each sandbox backend: ready, or why not (e.g. e2b without its API key); "
        "None on a node without the executor",
    )
    warm: WarmHealth | None = Field(
        None,
        description="warm starts on this node: enabled, hits and misses, and per pool its "
        "worker, version, ready and running children, hits, misses and resident memory; "
        "with FLOOM_E2B_WARM also `e2b`: count, budget, idle_seconds, hits, misses and per "
        "pool its template, network, ready, creating and running sandboxes, hits, misses "
        "and sandboxes replaced after a failed check; None on a node without the executor",
    )
