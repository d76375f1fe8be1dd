"""E2B warm starts (FLOOM_E2B_WARM; floom/sandbox/e2b/warm.py) against the wire-level stand-in:
each sandbox created ahead serves exactly one run and is killed after it, holds nothing of a
run before it, is replaced when it fails its check, is the reaper's once its process is gone,
and is killed on close; a run that finds none ready creates its own."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from floom.sandbox.base import SandboxUnavailable
from floom.sandbox.e2b.backend import E2BSandbox
from floom.sandbox.e2b.warm import POOL_LABEL, E2BWarmSettings, WarmBoxes
from tests.standins.e2b import E2BStandin
from tests.support.harness import wait_until
from tests.support.rigs.e2b import e2b_backend
from tests.support.rigs.sandboxes import run_script

NODE = "node-warm"
WHOAMI = "import os\nprint(os.environ['E2B_SANDBOX_ID'])\nprint(os.environ.get('TOKEN', '-'))"


@pytest.fixture
def standin(standin: E2BStandin) -> Iterator[E2BStandin]:
    """conftest.py's, and what a test's pool left is killed after it."""
    yield standin
    standin.core.kill_all()


@pytest.fixture
def warm(standin: E2BStandin) -> Iterator[E2BSandbox]:
    backend = e2b_backend(standin, e2b_warm=1, e2b_warm_idle_seconds=60)
    yield backend
    backend.close()


def run(backend: E2BSandbox, where: Path, *, node: str = NODE, **fields: Any) -> str:
    """Run WHOAMI; the id of the sandbox it ran in (it must succeed)."""
    where.mkdir()
    metadata = {"floom_node": node, "floom_run_id": f"run_{where.name}"}
    result, lines = run_script(backend, where, WHOAMI, metadata=metadata, **fields)
    assert result.exit_code == 0, (result, lines)
    return lines[0][1]


def ready_ids(standin: E2BStandin) -> set[str]:
    return {i for i, box in standin.sandboxes.items() if POOL_LABEL in box.metadata}


def started_pool(warm: E2BSandbox, standin: E2BStandin, tmp_path: Path) -> set[str]:
    """Start `warm`'s pool with a first run (a miss) and wait for it: its ready sandboxes."""
    run(warm, tmp_path / "first")
    assert warm.warm is not None
    assert warm.warm.wait_ready("base", timeout=30)
    return ready_ids(standin)


def test_a_ready_sandbox_serves_exactly_one_run_and_is_killed_after_it(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    assert warm.warm is not None
    first = run(warm, tmp_path / "first")  # starts the pool: a miss, its own sandbox
    assert warm.warm.wait_ready("base", timeout=30)
    (ready,) = ready_ids(standin)

    second = run(warm, tmp_path / "second")
    assert warm.warm.wait_ready("base", timeout=30)
    third = run(warm, tmp_path / "third")

    assert second == ready != first
    assert len({first, second, third}) == 3
    assert first in standin.killed
    assert second in standin.killed
    assert third in standin.killed
    ran = [sandbox for _, sandbox, line in standin.command_starts if "run.py" in line]
    assert sorted(ran) == sorted({first, second, third})  # one run per sandbox, never two
    stats = warm.warm_stats()
    assert stats is not None
    (pool,) = stats["pools"]
    assert (pool["template"], pool["network"], pool["hits"], pool["misses"]) == (
        "base",
        False,
        2,
        1,
    )


def test_a_ready_sandbox_holds_nothing_of_a_run_until_it_is_handed_one(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (ready,) = started_pool(warm, standin, tmp_path)
    assert warm.warm is not None
    box = standin.sandboxes[ready]
    assert box.env_vars == {}
    assert box.metadata == {"floom_node": NODE, POOL_LABEL: warm.warm.token}
    assert not any(box.home.iterdir())
    assert box.allow_internet is False
    # The run's secret reaches its command only, at run time.
    where = tmp_path / "secret"
    where.mkdir()
    result, lines = run_script(
        warm,
        where,
        WHOAMI,
        env={"TOKEN": "s3cret"},
        metadata={"floom_node": NODE, "floom_run_id": "run_secret"},
    )
    assert result.exit_code == 0
    assert lines == [("stdout", ready), ("stdout", "s3cret")]
    assert all("s3cret" not in str(b.env_vars) for b in standin.created)


def test_the_node_s_hits_and_misses_count_on_once_the_pool_they_were_made_in_is_dropped(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    # They are exported as counters (floom_warm_e2b_hits, _misses): one that went back
    # when an idle pool is dropped would read as a reset to a rate.
    assert warm.warm is not None
    warm.warm.close()
    warm.warm = WarmBoxes(
        E2BWarmSettings(count=1, idle_seconds=0.5),
        create=warm.warm._create,
        kill=warm.warm._kill,
    )
    run(warm, tmp_path / "first")  # a miss, which starts the pool
    assert warm.warm.wait_ready("base", timeout=30)
    run(warm, tmp_path / "second")  # a hit
    wait_until(lambda: warm.warm_stats()["pools"] == [], timeout=30)  # type: ignore[index]
    stats = warm.warm_stats()
    assert stats is not None
    assert (stats["hits"], stats["misses"]) == (1, 1)


def test_pools_are_per_template_and_network_and_a_run_finding_none_creates_its_own(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    run(warm, tmp_path / "base")
    assert warm.warm is not None
    assert warm.warm.wait_ready("base", timeout=30)
    (ready,) = ready_ids(standin)
    # Another template, and the same one with network: neither takes base's ready one.
    other = run(warm, tmp_path / "data", template="python-data")
    online = run(warm, tmp_path / "online", network=True)
    assert ready not in (other, online)
    assert ready in standin.sandboxes
    assert standin.sandboxes[ready].template == "base"
    stats = warm.warm_stats()
    assert stats is not None
    shapes = {(p["template"], p["network"]): (p["hits"], p["misses"]) for p in stats["pools"]}
    assert shapes == {
        ("base", False): (0, 1),
        ("python-data", False): (0, 1),
        ("base", True): (0, 1),
    }
    assert warm.warm.wait_ready("python-data", timeout=30)


def test_a_ready_sandbox_that_fails_its_check_is_replaced_and_the_run_goes_on(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (broken,) = started_pool(warm, standin, tmp_path)
    assert warm.warm is not None
    standin.kill_envd(broken)

    ran_in = run(warm, tmp_path / "second")

    assert ran_in != broken
    deadline = time.monotonic() + 10
    while broken not in standin.killed:
        assert time.monotonic() < deadline, "the broken sandbox was not killed"
        time.sleep(0.05)
    stats = warm.warm_stats()
    assert stats is not None
    assert stats["pools"][0]["replaced"] == 1
    assert warm.warm.wait_ready("base", timeout=30)


def test_failed_creates_while_refilling_do_not_break_runs(
    standin: E2BStandin, tmp_path: Path
) -> None:
    backend = e2b_backend(standin, e2b_warm=2, e2b_warm_idle_seconds=60)
    try:
        assert backend.warm is not None
        run(backend, tmp_path / "first")
        assert backend.warm.wait_ready("base", count=2, timeout=30)
        standin.fail_control_plane("server_error", route="POST /v2/sandboxes")
        # Both ready ones serve their runs; every refill fails meanwhile.
        hits = [run(backend, tmp_path / f"hit{i}") for i in range(2)]
        assert all(h in standin.killed for h in hits)
        creates = standin.requests["POST /v2/sandboxes"]
        deadline = time.monotonic() + 10
        while standin.requests["POST /v2/sandboxes"] < creates + 2:
            assert time.monotonic() < deadline, "the pool did not try to refill"
            time.sleep(0.05)
        standin.clear_faults()
        # E2B is back: the next run creates its own or takes a new ready one; the pool fills.
        run(backend, tmp_path / "after")
        assert backend.warm.wait_ready("base", count=2, timeout=30)
        stats = backend.warm_stats()
        assert stats is not None
        assert stats["hits"] >= 2
    finally:
        backend.close()


def test_the_budget_bounds_the_ready_sandboxes_of_the_node(
    standin: E2BStandin, tmp_path: Path
) -> None:
    backend = e2b_backend(standin, e2b_warm=3, e2b_warm_budget=2, e2b_warm_idle_seconds=60)
    try:
        assert backend.warm is not None
        run(backend, tmp_path / "base")
        run(backend, tmp_path / "data", template="python-data")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert len(ready_ids(standin)) <= 2
            time.sleep(0.05)
        assert len(ready_ids(standin)) == 2
    finally:
        backend.close()


def test_the_reaper_kills_ready_sandboxes_of_a_process_gone_never_its_own(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (mine,) = started_pool(warm, standin, tmp_path)
    assert warm.warm is not None
    # A run holding a ready sandbox is not an orphan either, live run ids or not.
    started = threading.Event()
    release = threading.Event()
    holding: dict[str, str] = {}

    def on_line(stream: str, line: str) -> None:
        holding.setdefault("id", line)
        started.set()

    def hold() -> None:
        where = tmp_path / "held"
        where.mkdir()
        with contextlib.suppress(SandboxUnavailable):  # its sandbox is reaped below
            run_script(
                warm,
                where,
                "import os, time\nprint(os.environ['E2B_SANDBOX_ID'], flush=True)\n"
                "while not os.path.exists('go'): time.sleep(0.05)\n",
                on_line=on_line,
                metadata={"floom_node": NODE, "floom_run_id": "run_held"},
                should_cancel=release.is_set,
            )

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(30)
        assert holding["id"] == mine
        assert warm.reap_orphans(node_id=NODE, work_root=tmp_path, live_run_ids=set) == 0
        assert warm.warm.wait_ready("base", timeout=30)
        # The same node's next process (this one died) kills what it left ready or running.
        successor = e2b_backend(standin, e2b_warm=1)
        try:
            left = ready_ids(standin)
            assert mine in left
            assert len(left) == 2
            assert successor.reap_orphans(node_id=NODE, work_root=tmp_path, live_run_ids=set) == 2
            assert not ready_ids(standin)
        finally:
            successor.close()
    finally:
        release.set()
        holder.join(timeout=30)


def test_close_kills_every_ready_sandbox_and_later_runs_create_their_own(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    ready = started_pool(warm, standin, tmp_path)

    warm.close()

    assert ready
    assert not ready_ids(standin)
    assert ready <= set(standin.killed)
    after = run(warm, tmp_path / "after")
    assert after not in ready
    assert after in standin.killed
    time.sleep(0.5)
    assert not ready_ids(standin)  # nothing refilled after close


def test_a_run_checks_at_most_two_ready_sandboxes_before_it_creates_its_own(
    standin: E2BStandin, tmp_path: Path
) -> None:
    backend = e2b_backend(standin, e2b_warm=3, e2b_warm_idle_seconds=60)
    try:
        assert backend.warm is not None
        run(backend, tmp_path / "first")
        assert backend.warm.wait_ready("base", count=3, timeout=30)
        broken = ready_ids(standin)
        for sandbox_id in broken:
            standin.kill_envd(sandbox_id)

        ran_in = run(backend, tmp_path / "second")

        assert ran_in not in broken
        stats = backend.warm_stats()
        assert stats is not None
        (pool,) = stats["pools"]
        assert (pool["replaced"], pool["hits"], pool["misses"]) == (2, 0, 2)
    finally:
        backend.close()


def test_a_run_whose_envd_dies_ends_and_its_ready_sandbox_is_killed_never_handed_again(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (ready,) = started_pool(warm, standin, tmp_path)
    where = tmp_path / "victim"
    where.mkdir()
    # The run takes down its own envd once it is running (as a hostile script could).
    script = "import os, time\nprint(os.environ['E2B_SANDBOX_ID'], flush=True)\ntime.sleep(30)"
    with pytest.raises(SandboxUnavailable):
        run_script(
            warm,
            where,
            script,
            on_line=lambda _, line: standin.kill_envd(line.strip()),
            metadata={"floom_node": NODE, "floom_run_id": "run_victim"},
        )
    assert ready in standin.killed
    after = run(warm, tmp_path / "after")
    assert after != ready
    stats = warm.warm_stats()
    assert stats is not None
    assert stats["pools"][0]["running"] == 0


def test_a_sandbox_whose_kill_failed_after_its_run_is_the_reapers_not_the_pools(
    warm: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (ready,) = started_pool(warm, standin, tmp_path)
    assert warm.warm is not None
    standin.fail_control_plane("server_error", route="DELETE /sandboxes/{sandboxID}")
    assert run(warm, tmp_path / "second") == ready
    standin.clear_faults()
    assert ready in standin.sandboxes  # E2B could not be told: it lives on
    assert warm.warm.wait_ready("base", timeout=30)
    assert run(warm, tmp_path / "third") != ready  # never handed to a second run
    assert warm.reap_orphans(node_id=NODE, work_root=tmp_path, live_run_ids=set) == 1
    assert ready not in standin.sandboxes
