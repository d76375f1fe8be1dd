"""Cron fire times in an IANA timezone, with floom's daylight-saving rules.

croniter enumerates wall-clock matches (standard 5-field cron: names, ranges, steps, `L`,
`W`, `#`; Sunday is 0 and 7); this module turns them into instants:

- a wall time that does not exist (the clocks jumped forward over it) fires once, at the
  first valid time after the gap;
- a wall time that happens twice (the clocks went back) fires once, at its first occurrence.

APScheduler's CronTrigger is not used because it reads weekday 0 as Monday.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from floom.errors import InvalidRequest

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_CHARS = re.compile(r"^[0-9A-Za-z*,/\-#?]+$")
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_MONTHS = {"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
_DAYS = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
# Letters each field may hold. croniter's R (random) and H (hashed) are refused: every node
# must compute the same fire times, or exactly-once across nodes breaks.
_WORDS: tuple[set[str], ...] = (set(), set(), {"l", "w"}, _MONTHS, _DAYS | {"l"})


class CronError(InvalidRequest):
    """A cron expression or timezone that cannot be used; the message says why."""

    status = 422
    code = "cron_invalid"


def normalise(expr: str) -> str:
    """The expression with aliases expanded and fields single-spaced; raises CronError."""
    text = " ".join(str(expr).split())
    text = ALIASES.get(text.lower(), text)
    fields = text.split(" ")
    if len(fields) != 5:
        raise CronError(
            f"'{expr}' has {len(fields)} field{'s' if len(fields) != 1 else ''}; "
            "cron needs 5: minute hour day-of-month month day-of-week"
        )
    for name, field, words in zip(_FIELD_NAMES, fields, _WORDS, strict=True):
        letters = re.findall(r"[a-z]+", field.lower())
        if not _FIELD_CHARS.match(field) or any(w not in words for w in letters):
            raise CronError(f"the {name} field '{field}' is not valid cron")
    try:
        croniter(text, datetime(2000, 1, 1))
    except (ValueError, KeyError) as exc:  # croniter's errors are ValueError subclasses
        raise CronError(f"'{expr}' is not a valid cron expression ({exc})") from exc
    return text


def zone(name: str) -> ZoneInfo:
    """The IANA timezone of that name; raises CronError."""
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronError(f"'{name}' is not an IANA timezone") from exc


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    if not name or name != name.strip() or ".." in name or name.startswith("/"):
        raise ValueError(name)
    return ZoneInfo(name)


def to_instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant when the naive local `wall` time fires, by the rules above."""
    first = wall.replace(tzinfo=tz, fold=0)
    back = first.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    if back == wall:
        return first.astimezone(UTC)
    # A wall time in a gap: move forward minute by minute to the first time that exists.
    probe = wall.replace(second=0, microsecond=0)
    for _ in range(24 * 60):
        probe += timedelta(minutes=1)
        candidate = probe.replace(tzinfo=tz, fold=0)
        if candidate.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == probe:
            return candidate.astimezone(UTC)
    return first.astimezone(UTC)  # no zone has a day-long gap; keep a defined answer


def iter_fire_times(expr: str, tz: ZoneInfo, *, after: datetime) -> Iterator[datetime]:
    """Strictly increasing UTC instants after `after` (aware) when `expr` fires in `tz`.

    Wall times are enumerated from the local time of `after`: earlier ones map to instants
    no later than `after`. Inside the second pass of a repeated hour, the wall times up to
    its end map to the first pass, before `after`, and are passed over.
    """
    start = after.astimezone(tz).replace(tzinfo=None)
    it = croniter(expr, start)
    last = after
    while True:
        try:
            wall = it.get_next(datetime)
        except (ValueError, KeyError):  # croniter gives up: the expression never fires again
            return
        instant = to_instant(wall, tz)
        if instant > last:
            last = instant
            yield instant


def next_fire_times(expr: str, tz: ZoneInfo, *, after: datetime, count: int) -> list[datetime]:
    times = []
    for instant in iter_fire_times(expr, tz, after=after):
        times.append(instant)
        if len(times) >= count:
            break
    return times


def fire_times_between(
    expr: str, tz: ZoneInfo, *, after: datetime, until: datetime, limit: int
) -> tuple[list[datetime], bool]:
    """Fire times in (after, until], at most `limit`; the flag says whether more were left."""
    times: list[datetime] = []
    for instant in iter_fire_times(expr, tz, after=after):
        if instant > until:
            return times, False
        if len(times) >= limit:
            return times, True
        times.append(instant)
    return times, False
