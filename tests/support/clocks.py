"""A node whose own clock is off by minutes, in-process: the clock-skew tests' nodes (leases,
the scheduler, alerts, handoffs, sessions) each run their steps under one `node_clock`."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from types import ModuleType

import pytest

from floom.store import models

# How far the tests' nodes are off: more than any lease, grace or session a test uses.
SKEW = timedelta(minutes=10)


@contextmanager
def node_clock(offset: timedelta, *, datetime_of: Iterable[ModuleType] = ()) -> Iterator[None]:
    """This node's clock, `offset` from the true time, wherever floom reads it: every floom
    module's `utcnow` (the database clock on SQLite included), and `datetime.now` in the
    modules of `datetime_of` (those that read the system clock themselves, as the
    scheduler does)."""

    def skewed() -> datetime:
        return datetime.now(UTC) + offset

    class SkewedDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) + offset

    true = models.utcnow
    with pytest.MonkeyPatch.context() as patch:
        for name, module in list(sys.modules.items()):
            if name.startswith("floom") and getattr(module, "utcnow", None) is true:
                patch.setattr(module, "utcnow", skewed)
        for module in datetime_of:
            patch.setattr(module, "datetime", SkewedDatetime)
        yield
