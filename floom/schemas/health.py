"""What /healthz answers: this node's state and the protections its sandboxes run under."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from floom.schemas.common import Public


class ExecutorHealth(Public):
    slots: int
    active: int


# A count or a size in warm pool figures: what a node writes into its row is read back by every
# node and shown (a size past a float's range, divided into MiB, raised in the CLI and the UI).
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]


class WarmPool(Public):
    """One pool of warm processes: a worker version's ready and running children."""

    version: str
    worker: str
    ready: Count
    running: Count
    hits: Count
    misses: Count
    modules: Count
    warm_processes_started: Count
    rss_bytes: Count


class E2BWarmPool(Public):
    """E2B sandboxes created ahead for one template and network setting."""

    template: str
    network: bool
    ready: Count
    creating: Count
    running: Count
    hits: Count
    misses: Count
    replaced: Count


class E2BWarmHealth(Public):
    """FLOOM_E2B_WARM's pools on this node."""

    enabled: bool
    count: Count
    budget: Count
    # Finite: a row holding NaN read back as null, which no client model takes.
    idle_seconds: float = Field(allow_inf_nan=False)
    hits: Count
    misses: Count
    pools: list[E2BWarmPool]


class WarmHealth(Public):
    enabled: bool
    pools: list[WarmPool]
    hits: Count
    misses: Count
    e2b: E2BWarmHealth | None = None


class Health(Public):
    status: Literal["ok"]
    version: str
    database: str = Field(description="the store's dialect: sqlite or postgresql")
    node: str
    roles: list[str] = Field(description="what this node does: api, scheduler, executor")
    held_back_run_logs: Count = Field(
        0,
        description="ended runs (of the whole cluster) whose later log lines wait in the "
        "database because their earlier log object is missing or damaged, as the object "
        "store's upkeep last found them",
    )
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
        "worker, version, ready and running children, hits, misses and resident memory "
        "(the pools only to a caller with a read key: they name workers); "
        "with FLOOM_E2B_WARM also `e2b`: count, budget, idle_seconds, hits, misses and per "
        "pool its template, network, ready, creating and running sandboxes, hits, misses "
        "and sandboxes replaced after a failed check; None on a node without the executor",
    )
