"""A node starts its roles in order under one ExitStack (floom/node.py): when a later start
fails, every role started before it is stopped again, so nothing is left running: no loop
thread, no listener of other nodes, no executor slots offered to the queue's writers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from floom.engine.loops.housekeeping import Housekeeping
from floom.engine.runtime import NodeRuntime
from floom.node import Node
from floom.services.context import Context
from tests.support.harness import fast_settings, wait_until


def _floom_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("floom-")}


def _names(threads: set[threading.Thread]) -> set[str]:
    return {t.name for t in threads}


def test_a_failed_start_stops_the_roles_started_before_it(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = Context.open(fast_settings(tmp_path / "data", database_url))
    before = _floom_threads()
    started: list[set[threading.Thread]] = []

    def refuse(self: Housekeeping) -> None:
        # The last role to start: by now the listener, executor and loops run.
        started.append(_floom_threads() - before)
        raise RuntimeError("housekeeping refused to start")

    monkeypatch.setattr(Housekeeping, "start", refuse)
    node = Node(ctx.settings, ctx=ctx)
    try:
        with pytest.raises(RuntimeError, match="housekeeping refused"), node.running():
            pytest.fail("the node started")

        (running,) = started
        expected = {"floom-dispatch", "floom-presence", "floom-handoffs", "floom-scheduler"}
        if database_url.startswith("postgresql"):
            expected.add("floom-listen")
        assert expected <= _names(running)
        wait_until(lambda: not (_floom_threads() - before), timeout=10)
        runtime = NodeRuntime.of(ctx)
        assert runtime is node.runtime
        assert runtime.dispatch is None  # the queue's writers no longer take runs here
    finally:
        ctx.engine.dispose()


def test_a_node_stops_its_roles_when_its_block_ends(tmp_path: Path, database_url: str) -> None:
    ctx = Context.open(fast_settings(tmp_path / "data", database_url))
    before = _floom_threads()
    try:
        with Node(ctx.settings, ctx=ctx).running() as node:
            assert node.executor is not None
            assert node.scheduler is not None
            assert {"floom-dispatch", "floom-scheduler", "floom-housekeeping"} <= _names(
                _floom_threads() - before
            )
        wait_until(lambda: not (_floom_threads() - before), timeout=10)
    finally:
        ctx.engine.dispose()
