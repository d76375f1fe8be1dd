"""What /metrics reports, read from the store at scrape time (prometheus-client collector).

Every figure comes from the database, so each node of a cluster answers the same cluster-wide
values: scrape one node (or any; take `max` across them). Counters are counts of stored rows
and stay monotonic as long as runs are kept (retention keeps the run rows; purging a deleted
worker's runs lowers them, which Prometheus reads as a counter reset).

A `worker` label names a deployed worker, at most MAX_WORKER_LABELS of them (the earliest
deployed): a deploy key can make any number of names, and each would be series kept for good
by Prometheus and by this process. What the others ran (deleted workers, names past the cap)
is counted under `worker="_other"`, which no worker can be called.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy import exists, func
from sqlmodel import col, select

from floom import __version__
from floom.services.access.principal import Principal
from floom.services.ops import held_logs
from floom.services.runs import approvals
from floom.services.runs import rules as run_rules
from floom.store.agents import Approval, Transcript
from floom.store.db import session_scope
from floom.store.models import Run, Worker, utcnow
from floom.store.triggers import TriggerFire, WebhookDelivery

if TYPE_CHECKING:
    from floom.services.context import Context

# Run duration buckets, seconds: from a quick script to a day-long agent run.
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400, 86400)
# Final error codes that mean the sandbox itself failed (not the worker's code).
SANDBOX_FAILURES = frozenset(
    {
        "sandbox_error",
        "sandbox_unavailable",
        "sandbox_identity_unavailable",
        "sandbox_network_unavailable",
        "cgroup_unavailable",
        "runtime_missing",
    }
)
# The scheduler lag reported as the worst of the fires in this window.
LAG_WINDOW = timedelta(hours=1)
# The most workers named in a `worker` label; OTHER_WORKERS counts the rest (not a worker
# name: those start with a letter, floom/manifest/schema.py NAME_PATTERN).
MAX_WORKER_LABELS = 1000
OTHER_WORKERS = "_other"


def labelled_workers(ctx: Context) -> frozenset[str]:
    """The workers /metrics names in its `worker` labels: the deployed ones, earliest first,
    at most MAX_WORKER_LABELS (a later deploy cannot push an earlier worker out)."""
    with session_scope(ctx.engine) as s:
        names = s.exec(
            select(Worker.name)
            .order_by(col(Worker.created_at), col(Worker.name))
            .limit(MAX_WORKER_LABELS)
        ).all()
    return frozenset(names)


def _label(worker: str, labelled: frozenset[str]) -> str:
    return worker if worker in labelled else OTHER_WORKERS


def _folded(
    rows: Iterable[tuple[Any, ...]], labelled: frozenset[str]
) -> dict[tuple[str, ...], float]:
    """`rows` of (worker, *other labels, value), summed by their labels once each worker not
    in `labelled` is OTHER_WORKERS."""
    found: dict[tuple[str, ...], float] = {}
    for worker, *rest, value in rows:
        key = (_label(worker, labelled), *(str(r) for r in rest))
        found[key] = found.get(key, 0) + (value or 0)
    return found


class DurationTally:
    """The run duration histogram per worker, kept up to date incrementally: the first
    scrape reads every finished run once, later ones only runs finished since (looking
    LOOKBACK further back, for a run whose end was committed after a later one's)."""

    LOOKBACK = timedelta(minutes=5)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        self._newest: datetime | None = None
        # Runs already counted that ended within LOOKBACK of the newest end seen.
        self._recent: dict[str, datetime] = {}

    def update(self, ctx: Context, labelled: frozenset[str]) -> None:
        """Count the runs finished since the last update, each under its worker's label
        (`_label`); a worker no longer labelled (deleted, or past the cap) has what it had
        counted moved under OTHER_WORKERS, so this holds MAX_WORKER_LABELS + 1 at most."""
        with self._lock, session_scope(ctx.engine) as s:
            for worker in [w for w in self._buckets if w != OTHER_WORKERS and w not in labelled]:
                self._add(OTHER_WORKERS, self._buckets.pop(worker), self._sums.pop(worker))
            q = select(Run.id, Run.worker_name, Run.started_at, Run.finished_at).where(
                col(Run.started_at).is_not(None), col(Run.finished_at).is_not(None)
            )
            if self._newest is not None:
                q = q.where(col(Run.finished_at) >= self._newest - self.LOOKBACK)
            for run_id, worker, started, finished in s.exec(q):
                if run_id in self._recent or finished is None or started is None:
                    continue
                self._recent[run_id] = finished
                self._newest = max(self._newest or finished, finished)
                seconds = max(0.0, (finished - started).total_seconds())
                counts = [int(seconds <= bound) for bound in DURATION_BUCKETS] + [1]
                self._add(_label(worker, labelled), counts, seconds)
            if self._newest is not None:
                horizon = self._newest - self.LOOKBACK
                self._recent = {r: f for r, f in self._recent.items() if f >= horizon}

    def _add(self, worker: str, counts: list[int], seconds: float) -> None:
        mine = self._buckets.setdefault(worker, [0] * (len(DURATION_BUCKETS) + 1))
        for i, n in enumerate(counts):
            mine[i] += n
        self._sums[worker] = self._sums.get(worker, 0.0) + seconds

    def family(self) -> HistogramMetricFamily:
        metric = HistogramMetricFamily(
            "floom_run_duration_seconds",
            "Time from a run's start to its end, for finished runs that started",
            labels=["worker"],
        )
        with self._lock:
            for worker in sorted(self._buckets):
                counts = self._buckets[worker]
                # prometheus_client leaves floatToGoString unannotated.
                les = [floatToGoString(b) for b in DURATION_BUCKETS]  # type: ignore[no-untyped-call]
                buckets = [(le, counts[i]) for i, le in enumerate(les)]
                buckets.append(("+Inf", counts[-1]))
                metric.add_metric([worker], buckets, sum_value=self._sums[worker])
        return metric


def exposition(registry: CollectorRegistry, *, caller: Principal) -> bytes:
    """The registry's metrics (a StoreCollector's among them) in the Prometheus text format.
    Needs the read scope."""
    caller.require("read")
    return generate_latest(registry)


class StoreCollector(Collector):
    """Collects floom's metrics from the store on every scrape."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.durations = DurationTally()

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        info = GaugeMetricFamily("floom_info", "This floom node", labels=["version", "node"])
        info.add_metric([__version__, self.ctx.node_id], 1)
        yield info
        labelled = labelled_workers(self.ctx)
        with session_scope(self.ctx.engine) as s:
            by_status = s.exec(
                select(Run.worker_name, Run.status, func.count()).group_by(
                    col(Run.worker_name), col(Run.status)
                )
            ).all()
            ready = (col(Run.not_before).is_(None)) | (col(Run.not_before) <= now)
            depth, oldest = s.exec(
                select(func.count(), func.min(Run.created_at)).where(
                    Run.status == run_rules.QUEUED, ready
                )
            ).one()
            # Every attempt of a script run starts its sandbox. An agent attempt starts one
            # only for its first command, and many run none (an exact replay never does):
            # one whose run spent sandbox time counts.
            is_agent = exists().where(col(Transcript.run_id) == col(Run.id))
            started = s.exec(
                select(Run.worker_name, func.coalesce(func.sum(Run.attempt), 0))
                .where(col(Run.started_at).is_not(None), ~is_agent)
                .group_by(col(Run.worker_name))
            ).all()
            agent_started = s.exec(
                select(Run.worker_name, func.count())
                .where(col(Run.started_at).is_not(None), is_agent, col(Run.sandbox_seconds) > 0)
                .group_by(col(Run.worker_name))
            ).all()
            sandbox_failed = s.exec(
                select(Run.worker_name, func.count())
                .where(col(Run.error_code).in_(sorted(SANDBOX_FAILURES)))
                .group_by(col(Run.worker_name))
            ).all()
            latest_fire = s.exec(
                select(TriggerFire.scheduled_for, TriggerFire.created_at)
                .order_by(col(TriggerFire.scheduled_for).desc())
                .limit(1)
            ).first()
            recent_fires = s.exec(
                select(TriggerFire.scheduled_for, TriggerFire.created_at).where(
                    col(TriggerFire.scheduled_for) >= now - LAG_WINDOW
                )
            ).all()
            deliveries = s.exec(
                select(WebhookDelivery.source, WebhookDelivery.outcome, func.count()).group_by(
                    col(WebhookDelivery.source), col(WebhookDelivery.outcome)
                )
            ).all()
            pending = s.exec(
                select(Approval.worker_name, func.count())
                .where(Approval.status == approvals.PENDING)
                .group_by(col(Approval.worker_name))
            ).all()
            usage = s.exec(
                select(
                    Transcript.worker_name,
                    func.sum(Transcript.input_tokens),
                    func.sum(Transcript.output_tokens),
                    func.sum(Transcript.cost_usd),
                ).group_by(col(Transcript.worker_name))
            ).all()

        runs = GaugeMetricFamily(
            "floom_runs", "Stored runs by worker and status", labels=["worker", "status"]
        )
        for labels, n in _folded(by_status, labelled).items():
            runs.add_metric(list(labels), n)
        yield runs
        yield GaugeMetricFamily(
            "floom_queue_depth",
            "Queued runs ready to start (not held back by a retry delay)",
            value=depth,
        )
        yield GaugeMetricFamily(
            "floom_queue_oldest_age_seconds",
            "Age of the oldest ready queued run (0 when the queue is empty)",
            value=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
        )
        self.durations.update(self.ctx, labelled)
        yield self.durations.family()
        starts = CounterMetricFamily(
            "floom_sandbox_starts",
            "Attempts that started a sandbox (a script's run, an agent's first command), by worker",
            labels=["worker"],
        )
        for labels, n in sorted(_folded([*started, *agent_started], labelled).items()):
            starts.add_metric(list(labels), int(n))
        yield starts
        failures = CounterMetricFamily(
            "floom_sandbox_failures",
            "Runs that ended because the sandbox failed (not the worker's code), by worker",
            labels=["worker"],
        )
        for labels, n in _folded(sandbox_failed, labelled).items():
            failures.add_metric(list(labels), n)
        yield failures
        lags = [max(0.0, (c - f).total_seconds()) for f, c in recent_fires]
        yield GaugeMetricFamily(
            "floom_scheduler_lag_seconds",
            "How late the latest schedule tick was handled after its fire time",
            value=max(0.0, (latest_fire[1] - latest_fire[0]).total_seconds())
            if latest_fire
            else 0.0,
        )
        yield GaugeMetricFamily(
            "floom_scheduler_lag_max_seconds",
            "The worst lag of the schedule ticks of the last hour",
            value=max(lags, default=0.0),
        )
        hooks = CounterMetricFamily(
            "floom_webhook_deliveries",
            "Stored webhook and Composio deliveries by outcome",
            labels=["source", "outcome"],
        )
        for source, outcome, n in deliveries:
            hooks.add_metric([source, outcome], n)
        yield hooks
        waiting = GaugeMetricFamily(
            "floom_approvals_pending", "Approvals waiting for a person", labels=["worker"]
        )
        for labels, n in _folded(pending, labelled).items():
            waiting.add_metric(list(labels), n)
        yield waiting
        yield GaugeMetricFamily(
            "floom_run_logs_held_back",
            "Ended runs whose later log lines wait in the database because their earlier log "
            "object is missing or damaged",
            value=held_logs.held_back_count(self.ctx.engine),
        )
        tokens = CounterMetricFamily(
            "floom_agent_tokens", "Model tokens used by agent runs", labels=["worker", "kind"]
        )
        cost = CounterMetricFamily(
            "floom_agent_cost_usd", "Model cost of agent runs, in US dollars", labels=["worker"]
        )
        used = [(w, kind, n) for w, i, o, _ in usage for kind, n in (("input", i), ("output", o))]
        for labels, n in _folded(used, labelled).items():
            tokens.add_metric(list(labels), int(n))
        for labels, dollars in _folded([(w, d) for w, _, _, d in usage], labelled).items():
            cost.add_metric(list(labels), float(dollars))
        yield tokens
        yield cost


class WarmCollector(Collector):
    """Collects a node's warm pools (floom/sandbox/local/warm/, and E2B's under `e2b`:
    floom/sandbox/e2b/warm.py) on every scrape: `stats` is its executor's `warm_stats`."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        found = self.stats()
        if not found:
            return
        yield CounterMetricFamily(
            "floom_warm_hits",
            "Runs that started from a warm process ready for them",
            value=found["hits"],
        )
        yield CounterMetricFamily(
            "floom_warm_misses",
            "Runs that could have started warm and started cold",
            value=found["misses"],
        )
        pools = found["pools"]
        yield GaugeMetricFamily("floom_warm_pools", "Warm pools on this node", value=len(pools))
        ready = GaugeMetricFamily(
            "floom_warm_ready", "Warm children ready, by worker", labels=["worker", "version"]
        )
        rss = GaugeMetricFamily(
            "floom_warm_resident_bytes",
            "Resident memory of each warm process",
            labels=["worker", "version"],
        )
        for pool in pools:
            labels = [pool["worker"], pool["version"]]
            ready.add_metric(labels, pool["ready"])
            rss.add_metric(labels, pool["rss_bytes"])
        yield ready
        yield rss
        if found.get("e2b"):
            yield from _e2b_warm(found["e2b"])


def _e2b_warm(found: dict[str, Any]) -> Iterator[Metric]:
    """The E2B backend's warm pools (floom/sandbox/e2b/warm.py)."""
    yield CounterMetricFamily(
        "floom_warm_e2b_hits",
        "Runs in E2B handed a sandbox created ahead of them",
        value=found["hits"],
    )
    yield CounterMetricFamily(
        "floom_warm_e2b_misses",
        "Runs in E2B that found no sandbox ready and created their own",
        value=found["misses"],
    )
    labels = ["template", "network"]
    gauges = {
        key: GaugeMetricFamily(f"floom_warm_e2b_{key}", text, labels=labels)
        for key, text in (
            ("ready", "E2B sandboxes ready for runs, by template and network"),
            ("creating", "E2B sandboxes being created for a pool"),
            ("running", "E2B sandboxes of a pool serving a run"),
        )
    }
    for pool in found["pools"]:
        values = [pool["template"], "on" if pool["network"] else "off"]
        for key, gauge in gauges.items():
            gauge.add_metric(values, pool[key])
    yield from gauges.values()
