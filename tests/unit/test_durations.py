"""How the CLI and the web UI word a duration: milliseconds under a second (a warm run takes
a few), seconds under two minutes (a minute in the UI), minutes past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from floom.cli.console import took
from floom.ui.support import seconds_text

START = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.0, "0ms"),
        (0.0123, "12ms"),
        (0.9994, "999ms"),
        (1.25, "1.2s"),
        (119.0, "119.0s"),
        (150, "2.5m"),
    ],
)
def test_a_duration_is_said_in_the_unit_that_shows_it(seconds: float, said: str) -> None:
    assert took(START, START + timedelta(seconds=seconds)) == said
    assert took(START.isoformat(), (START + timedelta(seconds=seconds)).isoformat()) == said


def test_a_run_not_started_has_no_duration() -> None:
    assert took(None, None) == "-"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.012, "12 ms"), (2.5, "2.5 s"), (200, "3 min 20 s"), (3900, "1 h 5 min")],
)
def test_the_web_ui_says_a_duration_as_people_read_it(seconds: float, said: str) -> None:
    assert seconds_text(seconds) == said
