"""Cron fire times in an IANA timezone, with floom's daylight-saving rules.

APScheduler's CronTrigger enumerates the wall-clock matches of a standard 5-field cron
expression (minute hour day-of-month month day-of-week: names, ranges, steps, `L` and
`xL`, `x#n`; Sunday is 0 and 7), translated here field by field: APScheduler 3 reads
weekday 0 as Monday and ANDs the two day fields, where cron means Sunday and ORs them.
This module turns the wall times into instants:

- a wall time that does not exist (the clocks jumped forward over it) fires once, at the
  first valid time after the gap;
- a wall time that happens twice (the clocks went back) fires once, at its first occurrence.

The trigger runs in UTC over naive wall times, so APScheduler never sees a gap or a fold;
the rules above are floom's own (docs/explanation/cluster-internals.md, "Scheduler design").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

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
_MONTH_ORDER = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = set(_MONTH_ORDER)
_DAYS = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
# Letters each field may hold. Some crons' R (random) and H (hashed) are refused: every
# node must compute the same fire times, or exactly-once across nodes breaks.
_WORDS: tuple[set[str], ...] = (set(), set(), {"l"}, _MONTHS, _DAYS | {"l"})


class CronError(InvalidRequest):
    """A cron expression or timezone that cannot be used; the message says why."""

    status = 422
    code = "cron_invalid"


# Longer than any cron line needs (every minute, hour, day and month listed is ~360): a
# longer one is refused before it is parsed, so a deploy cannot hand the scheduler an
# expression of thousands of alternatives to compute at every pass.
MAX_EXPRESSION_CHARS = 512


def normalise(expr: str) -> str:
    """The expression with aliases expanded and fields single-spaced; raises CronError."""
    if len(str(expr)) > MAX_EXPRESSION_CHARS:
        raise CronError(
            f"the cron expression is {len(str(expr))} characters long; at most "
            f"{MAX_EXPRESSION_CHARS} are accepted",
            hint="write ranges and steps instead of long lists, e.g. '*/5 9-17 * * mon-fri'",
        )
    text = " ".join(str(expr).split())
    text = ALIASES.get(text.lower(), text)
    fields = text.split(" ")
    if len(fields) != 5:
        raise CronError(
            f"'{_shown(str(expr))}' has {len(fields)} field{'s' if len(fields) != 1 else ''}; "
            "cron needs 5: minute hour day-of-month month day-of-week"
        )
    for name, field, words in zip(_FIELD_NAMES, fields, _WORDS, strict=True):
        letters = re.findall(r"[a-z]+", field.lower())
        if not _FIELD_CHARS.fullmatch(field) or any(w not in words for w in letters):
            raise CronError(f"the {name} field '{_shown(field)}' is not valid cron")
    trigger(text)
    return text


def _shown(text: str, limit: int = 80) -> str:
    """`text` as an error message may quote it: cut to `limit` characters, and control
    characters written as escapes."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)


# An expression with no fire time in these years never fires (e.g. 30 February); they hold
# every combination of a date and a weekday, across a century's missing leap day too.
# Asking APScheduler instead would have it search up to the year 9999, for seconds.
PROBE_YEARS = (datetime(2080, 1, 1, tzinfo=UTC), datetime(2120, 12, 31, tzinfo=UTC))
_ORDINALS = ("1st", "2nd", "3rd", "4th", "5th")
# Cron's weekday numbers (0 and 7: Sunday) as APScheduler's names: names cannot be misread.
_WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_MONTH_NUMBERS = {name: str(i) for i, name in enumerate(_MONTH_ORDER, start=1)}


@lru_cache(maxsize=1024)
def trigger(text: str) -> BaseTrigger | None:
    """APScheduler's trigger of a normalised 5-field expression, over wall times in UTC, or
    None for one that never fires; raises CronError.

    Cron's day rule: when both day fields are restricted (neither starts with `*` or `?`),
    a day matches if either matches; otherwise both must. CronTrigger ANDs its fields, so
    the OR becomes an OrTrigger of one CronTrigger per alternative.
    """
    minute, hour, dom, month, dow = text.lower().split(" ")
    month = re.sub("[a-z]+", lambda m: _MONTH_NUMBERS[m.group()], month)
    by_weekday, by_position = _weekdays(dow)
    dom_star, dow_star = dom[0] in "*?", dow[0] in "*?"
    day = "*" if dom in ("*", "?") else dom.replace("l", "last")
    alternatives: list[dict[str, str]] = []
    if dom_star or dow_star:  # both day fields must match
        if by_position and day != "*":
            raise CronError(
                f"'{_shown(text)}': a day-of-week with L or # cannot be combined with "
                f"'{_shown(dom)}'",
                hint="use * as the day of month",
            )
        if by_weekday is not None:
            alternatives.append({"day": day, "day_of_week": by_weekday})
        alternatives += [{"day": p, "day_of_week": "*"} for p in by_position]
    else:  # either day field may match
        alternatives.append({"day": day, "day_of_week": "*"})
        if by_weekday is not None:
            alternatives.append({"day": "*", "day_of_week": by_weekday})
        alternatives += [{"day": p, "day_of_week": "*"} for p in by_position]
    fields = {"year": "*", "month": month, "hour": hour, "minute": minute, "second": "0"}
    try:
        triggers = [CronTrigger(**fields, **days, timezone=UTC) for days in alternatives]
        start, end = PROBE_YEARS
        probes = [
            CronTrigger(**fields, **days, timezone=UTC, end_date=end) for days in alternatives
        ]
    except ValueError as exc:
        raise CronError(
            f"'{_shown(text)}' is not a valid cron expression ({_shown(str(exc), 200)})"
        ) from exc
    if all(p.get_next_fire_time(None, start) is None for p in probes):
        return None
    return triggers[0] if len(triggers) == 1 else OrTrigger(triggers)


def _weekdays(field: str) -> tuple[str | None, list[str]]:
    """The day-of-week field as APScheduler weekday names (None: no plain weekday item) and
    as day-of-month positions (`5L` -> "last fri", `1#2` -> "2nd mon")."""
    if field in ("*", "?"):
        return "*", []
    days: set[int] = set()
    positions: list[str] = []
    for item in field.split(","):
        item = re.sub("[a-z]{3}", lambda m: str(_WEEKDAY_NAMES.index(m.group())), item)
        # Each position once (7 weekdays x 6 positions at most): every one becomes a trigger
        # of its own that the scheduler asks at each fire time.
        if m := re.fullmatch(r"([0-7])l", item):
            position = f"last {_WEEKDAY_NAMES[int(m[1])]}"
            positions += [] if position in positions else [position]
            continue
        if m := re.fullmatch(r"([0-7])#([1-5])", item):
            position = f"{_ORDINALS[int(m[2]) - 1]} {_WEEKDAY_NAMES[int(m[1])]}"
            positions += [] if position in positions else [position]
            continue
        m = re.fullmatch(r"(\*|[0-7])(?:-([0-7]))?(?:/([1-9][0-9]*))?", item)
        if m is None:
            raise CronError(f"the day of week field '{_shown(field)}' is not valid cron")
        first = 0 if m[1] == "*" else int(m[1])
        last = int(m[2]) if m[2] else (6 if m[1] == "*" or m[3] else first)
        if first > last:
            raise CronError(
                f"the day of week range '{item}' runs backwards",
                hint="write it as two ranges, e.g. 5-6,0 for Friday to Sunday",
            )
        days.update(n % 7 for n in range(first, last + 1, int(m[3] or 1)))
    if not days:
        return None, positions
    return ",".join(_WEEKDAY_NAMES[n] for n in sorted(days)), positions


# Files of the host's zoneinfo folder that are no IANA zone of their own: `localtime` links to
# the host's /etc/localtime and `posixrules` is a copy of some zone the host chose, so nodes
# set up differently would fire one tick at different instants (each once: twice in all);
# `right/` zones count leap seconds (times ~27 s off) and `posix/` holds copies of the plain
# names that not every host ships.
_HOST_ZONES = frozenset({"localtime", "posixrules"})
_HOST_PREFIXES = ("right/", "posix/")


def host_file(name: str) -> bool:
    """Whether `name` is one of the zone folder's files that no schedule may name."""
    return name in _HOST_ZONES or name.startswith(_HOST_PREFIXES)


def zone(name: str) -> ZoneInfo:
    """The IANA timezone of that name; raises CronError."""
    if host_file(name):
        plain = name.split("/", 1)[1] if name.startswith(_HOST_PREFIXES) else "Europe/Berlin"
        raise CronError(
            f"'{_shown(name)}' is not an IANA timezone: it names a file of this host's zone "
            "folder, which other hosts may not have or may point at another zone",
            hint=f"name the zone itself, e.g. {plain}",
        )
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronError(f"'{_shown(name)}' is not an IANA timezone") from exc


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
    matches = trigger(expr)
    wall = after.astimezone(tz).replace(tzinfo=UTC)  # naive wall time, computed in UTC
    last = after
    while matches is not None:
        found = matches.get_next_fire_time(wall, wall)
        if found is None:
            return
        wall = found
        instant = to_instant(wall.replace(tzinfo=None), tz)
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
