"""What a node's alert loop sends the database while nothing happens: its first pass reads
everything, every later one is the watch's probe alone (one statement), where each pass
used to run every check and look for due deliveries (about fifteen statements). Both stores.
(What each pass still finds, and when: test_alert_pace.py.)"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from floom.engine.loops.alerts import AlertLoop
from floom.services.alerts import watch
from floom.services.context import Context
from floom.services.ops import nodes
from tests.support.harness import fast_settings

PASSES = 30


@pytest.fixture
def quick(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(
        fast_settings(tmp_path / "data", database_url, lease_seconds=600.0, alert_poll_seconds=0.01)
    )
    yield context
    context.engine.dispose()


def test_an_idle_node_s_alert_loop_sends_one_statement_a_pass(
    quick: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes.register(quick, slots=1)  # a live node, as the loop's own would be
    sent: list[str] = []
    starts: list[int] = []  # statements sent before each pass began
    enough = threading.Event()

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The loop's thread only; SQLite's BEGIN is the driver's own.
        if threading.current_thread().name == "floom-alerts" and not statement.startswith("BEGIN"):
            sent.append(statement)

    original = watch.watch

    def counted(*args: Any, **kwargs: Any) -> int:
        starts.append(len(sent))
        if len(starts) > PASSES:
            enough.set()
        return original(*args, **kwargs)

    monkeypatch.setattr(watch, "watch", counted)
    event.listen(quick.engine, "before_cursor_execute", note)
    loop = AlertLoop(quick)
    loop.start()
    try:
        assert enough.wait(60), f"the loop made {len(starts)} passes in 60 s"
    finally:
        loop.stop()
        event.remove(quick.engine, "before_cursor_execute", note)

    # Each pass after the first two (the first reads everything and sets the probe's
    # counts) sent the probe alone.
    per_pass = [b - a for a, b in itertools.pairwise(starts[2:])]
    assert len(per_pass) >= PASSES - 3
    assert set(per_pass) == {1}, per_pass
