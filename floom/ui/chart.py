"""The worker page's 30-day chart as inline SVG geometry (no script, no build step): a bar per
day split by outcome, and the day's duration p50 and p95 as two lines."""

from __future__ import annotations

from typing import Any

from floom.services.runs.stats import OUTCOMES, Day
from floom.ui.support import seconds_text

WIDTH = 600
BARS_HEIGHT = 100
LINES_HEIGHT = 60
GAP = 0.25  # of a day's slot, between bars


def _seconds(value: float | None) -> str:
    return "—" if value is None else seconds_text(value)


def _polyline(points: list[tuple[float, float]], width: float) -> str:
    """SVG points through the middle of each day's slot. A line through one point draws
    nothing, so a lone day becomes a level stroke across its bar."""
    if len(points) == 1:
        ((x, y),) = points
        return f"{round(x, 2)},{y} {round(x + width, 2)},{y}"
    return " ".join(f"{round(x + width / 2, 2)},{y}" for x, y in points)


def history_chart(days: list[Day]) -> dict[str, Any]:
    """Rectangles, polylines and labels for the template; empty when nothing ran."""
    if not days or not any(d.total for d in days):
        return {"empty": True, "days": len(days)}
    slot = WIDTH / len(days)
    most = max(d.total for d in days)
    slowest = max((d.p95 or 0.0) for d in days) or 1.0
    bars = []
    p50: list[tuple[float, float]] = []
    p95: list[tuple[float, float]] = []
    for i, day in enumerate(days):
        x = i * slot + slot * GAP / 2
        y = float(BARS_HEIGHT)
        parts = []
        for outcome in OUTCOMES:
            n = day.counts[outcome]
            if not n:
                continue
            h = BARS_HEIGHT * n / most
            y -= h
            parts.append({"y": round(y, 2), "h": round(h, 2), "outcome": outcome})
        label = (
            f"{day.day.isoformat()}: "
            + ", ".join(f"{day.counts[o]} {o}" for o in OUTCOMES if day.counts[o])
            + (f"; p50 {_seconds(day.p50)}, p95 {_seconds(day.p95)}" if day.p50 is not None else "")
            if day.total
            else f"{day.day.isoformat()}: no runs"
        )
        bars.append(
            {"x": round(x, 2), "w": round(slot * (1 - GAP), 2), "parts": parts, "label": label}
        )
        for line, value in ((p50, day.p50), (p95, day.p95)):
            if value is not None:
                line.append((x, round(LINES_HEIGHT - LINES_HEIGHT * value / slowest, 2)))
    width = slot * (1 - GAP)
    return {
        "empty": False,
        "width": WIDTH,
        "bars_height": BARS_HEIGHT,
        "lines_height": LINES_HEIGHT,
        "bars": bars,
        "p50": _polyline(p50, width),
        "p95": _polyline(p95, width),
        "most": most,
        "slowest": _seconds(slowest),
        "first": days[0].day.isoformat(),
        "last": days[-1].day.isoformat(),
        "total": sum(d.total for d in days),
    }
