"""A worker's recent history by day: runs per day by outcome and the day's duration p50 and
p95, for the worker page's 30-day chart."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from sqlmodel import col, select

from floom.services.access.principal import Principal
from floom.services.runs import rules as run_rules
from floom.store.db import session_scope
from floom.store.models import Run, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

# The outcomes a day's bar is split into, bottom to top.
OUTCOMES = ("succeeded", "failed", "other")
_FAILED = frozenset({run_rules.FAILED, run_rules.TIMED_OUT, run_rules.LIMIT_EXCEEDED})


@dataclass
class Day:
    day: date
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    p50: float | None = None
    p95: float | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def outcome_of(status: str) -> str:
    if status == run_rules.SUCCEEDED:
        return "succeeded"
    return "failed" if status in _FAILED else "other"


def daily_history(
    ctx: Context,
    *,
    worker_name: str,
    days: int = 30,
    now: datetime | None = None,
    caller: Principal,
) -> list[Day]:
    """The last `days` UTC days, oldest first, with the runs created on each: finished runs
    by outcome (succeeded, failed incl. timed out and over limits, other ended states) and
    the duration percentiles of those that ran. Needs the read scope."""
    caller.require("read")
    today = (now or utcnow()).astimezone(UTC).date()
    first = today - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(Run.created_at, Run.status, Run.started_at, Run.finished_at).where(
                Run.worker_name == worker_name,
                col(Run.created_at) >= start,
                col(Run.status).in_(sorted(run_rules.FINISHED)),
            )
        ).all()
    by_day = {first + timedelta(days=i): Day(first + timedelta(days=i)) for i in range(days)}
    durations: dict[date, list[float]] = {}
    for created, status, started, finished in rows:
        entry = by_day.get(created.astimezone(UTC).date())
        if entry is None:
            continue
        entry.counts[outcome_of(status)] += 1
        if started is not None and finished is not None:
            durations.setdefault(entry.day, []).append((finished - started).total_seconds())
    for day, values in durations.items():
        values.sort()
        by_day[day].p50 = percentile(values, 0.50)
        by_day[day].p95 = percentile(values, 0.95)
    return list(by_day.values())


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values."""
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]
