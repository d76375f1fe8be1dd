"""Releasing what a run held off its slot's path (floom/sandbox/releases.py), for real under
bubblewrap: the next run goes on while a release is pending, and nothing the release frees
(the run's uid, its run dir) is taken again before it is done."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.engine.cleanup import discard_later
from floom.sandbox import LocalSandbox, Sandbox, SandboxSpec
from floom.sandbox.local import cgroups
from floom.sandbox.local.uid_pool import DEFAULT_UID_BASE, UidLease, UidPool, UidRange
from tests.support.harness import wait_until
from tests.support.processes.statuses import process_statuses
from tests.support.rigs.sandboxes import Lines
from tests.support.rigs.warm import WarmedLocal, cold_or_warm, warm_script_spec

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need floom to run as root"),
]

UID = """
import json, os
print(json.dumps({"uid": os.getuid()}))
"""


@pytest.fixture(params=["cold", "warm"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    with cold_or_warm(request.param, tmp_path) as made:
        yield made


def local_of(sandbox: Sandbox) -> LocalSandbox:
    local = sandbox.local if isinstance(sandbox, WarmedLocal) else sandbox
    assert isinstance(local, LocalSandbox)
    return local


def uids_of(local: LocalSandbox) -> UidPool:
    assert local._uids is not None
    return local._uids


def run_uid(sandbox: Sandbox, work_root: Path) -> int:
    """Run UID in a fresh run dir under `work_root`; the host uid it ran as."""
    work_root.mkdir(exist_ok=True)
    spec: SandboxSpec = warm_script_spec(work_root, UID)
    lines: Lines = []
    result = sandbox.run(
        spec, on_line=lambda *line: lines.append(line), should_cancel=lambda: False
    )
    assert result.exit_code == 0, lines
    found = [json.loads(line) for stream, line in lines if stream == "stdout"]
    assert found, lines
    uid = found[-1]["uid"]
    assert isinstance(uid, int)
    return uid


def processes_of_uid(uid: int) -> list[int]:
    return [int(s["Pid"]) for s in process_statuses() if int(s["Uid"].split()[0]) == uid]


def test_the_next_run_goes_on_while_the_last_one_s_release_is_pending_and_its_uid_stays_taken(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    local = local_of(sandbox)
    uids = uids_of(local)
    gate = threading.Event()
    local.releases.add(lambda: gate.wait(30))  # every release after it waits for the gate
    try:
        first = run_uid(sandbox, tmp_path / "root")
        assert local.releases.pending() >= 2  # the gate and the first run's release
        second = run_uid(sandbox, tmp_path / "root")

        # The second run went on while the first one's release waited: the first one's uid
        # stays taken meanwhile, though every process of that run has ended.
        assert second != first
        assert first in uids.held()
        wait_until(lambda: processes_of_uid(first) == [], timeout=10)
    finally:
        gate.set()
    assert local.releases.drain()
    assert first not in uids.held()
    assert second not in uids.held()


def test_closing_the_sandbox_finishes_the_releases_still_pending(tmp_path: Path) -> None:
    # On uids of its own: a uid given back is another test's to take at once (the suite's
    # other worker runs sandboxes too), and its processes are not this run's leftovers.
    with on_a_range_of(6, DEFAULT_UID_BASE + 840, "warm", tmp_path) as sandbox:
        local = local_of(sandbox)
        uids = uids_of(local)
        run_uid(sandbox, tmp_path / "root")  # the pool is warm now
        # A release that takes a while holds up the next run's: close waits for both.
        local.releases.add(lambda: threading.Event().wait(0.5))
        uid = run_uid(sandbox, tmp_path / "root")
    # Closed: no release is left, the run's uid is given back, and no process (nor zombie,
    # which the session's guard looks for) is left of it.
    assert local.releases.pending() == 0
    assert uid not in uids.held()
    assert processes_of_uid(uid) == []


def test_a_run_dir_discarded_with_its_release_pending_is_made_again_once_it_is_done(
    tmp_path: Path,
) -> None:
    local = LocalSandbox()
    try:
        if local.disks is None or not local.disks.usable():
            pytest.skip("a run dir's own disk needs root and loop devices")
        run_dir = tmp_path / "root" / "run-1"
        local.make_run_dir(run_dir, disk_mb=8)
        assert os.path.ismount(run_dir)
        (run_dir / "left").write_text("by the first run")
        local.releases.add(lambda: threading.Event().wait(0.5))
        local.discard_run_dir(run_dir, delete=discard_later)
        assert os.path.ismount(run_dir)  # its release waits behind the slow one

        # The same path again (a run's next phase): made once the release has unmounted and
        # renamed the old one away, on a disk of its own that holds nothing of the first.
        local.make_run_dir(run_dir, disk_mb=8)
        assert os.path.ismount(run_dir)
        assert not (run_dir / "left").exists()
        local.discard_run_dir(run_dir, delete=discard_later)
        assert local.releases.drain()
        assert not os.path.ismount(run_dir)
    finally:
        local.close()


def test_a_run_whose_release_is_pending_weighs_nothing_in_the_runs_cpu_share(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # The runs' group weighs one process per live run: runs ended but not yet released
    # counted too would take CPU from floom's own threads (the server) meanwhile. Counted
    # in this process (the kernel's file is shared with every floom on the machine).
    parent = cgroups.detect().parents.get(cgroups.CPU)
    if parent is None:
        pytest.skip("no CPU controller for runs here")
    local = local_of(sandbox)
    gate = threading.Event()
    local.releases.add(lambda: gate.wait(30))
    try:
        run_uid(sandbox, tmp_path / "root")
        run_uid(sandbox, tmp_path / "root")
        assert local.releases.pending() >= 3  # the gate and both runs' releases
        assert cgroups.runs_weighed(parent) == 0
    finally:
        gate.set()
    assert local.releases.drain()
    assert cgroups.runs_weighed(parent) == 0


@contextlib.contextmanager
def on_a_range_of(count: int, base: int, start: str, tmp_path: Path) -> Iterator[Sandbox]:
    """A sandbox of one slot, `start`ed cold or warm, whose runs take their uids from the
    `count` uids from `base` (none of which another test uses)."""
    local = LocalSandbox(uids=UidRange(base=base, count=count), runs_at_once=1)
    with cold_or_warm(start, tmp_path, local) as sandbox:
        yield sandbox


@dataclasses.dataclass
class Ran:
    uid: int
    cgroup: cgroups.RunCgroup


def runs_while_releases_stall(sandbox: Sandbox, work_root: Path, runs: int) -> list[Ran]:
    """`runs` runs one after another while the releases' thread is held by a gate: each
    run's uid, and its cgroup as the run configured it."""
    made: list[cgroups.RunCgroup] = []
    configure = cgroups.RunCgroup.configure

    def configured(group: cgroups.RunCgroup, limits: cgroups.CgroupLimits) -> None:
        configure(group, limits)
        made.append(group)

    local = local_of(sandbox)
    gate = threading.Event()
    local.releases.add(lambda: gate.wait(60))  # every release after it waits for the gate
    ran: list[Ran] = []
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cgroups.RunCgroup, "configure", configured)
            for _ in range(runs):
                uid = run_uid(sandbox, work_root)
                ran.append(Ran(uid, made[-1]))
                # A uid taken again is one whose run's cgroup was gone first.
                for earlier in ran[:-1]:
                    if earlier.uid == uid:
                        assert not any(os.path.isdir(d) for d in earlier.cgroup.dirs.values())
        assert local.releases.pending() >= 2  # the gate, and some runs' releases behind it
    finally:
        gate.set()
    assert local.releases.drain()
    return ran


@pytest.mark.parametrize("start", ["cold", "warm"])
def test_a_run_never_waits_for_a_uid_that_a_pending_release_holds(
    start: str, tmp_path: Path
) -> None:
    # Six uids for one slot, seven runs while no release can end: a release keeps its run's
    # uid only while the two a run may take stay free beside it; past that, the slot
    # releases its run itself. Left to the stalled thread, the seventh run would find the
    # range used up and wait for the releases (or fail).
    base = DEFAULT_UID_BASE + 800
    with on_a_range_of(6, base, start, tmp_path) as sandbox:
        ran = runs_while_releases_stall(sandbox, tmp_path / "root", 7)
        pool = uids_of(local_of(sandbox))
        assert len({run.uid for run in ran}) < len(ran)  # some uids were taken again
        assert {run.uid for run in ran} <= set(range(base, base + 6))
        held = pool.held()
    # Once the releases are done only the warm process holds a uid, if any.
    assert len(held) == (1 if start == "warm" else 0)


@pytest.mark.parametrize("start", ["cold", "warm"])
def test_a_run_whose_cgroup_stays_keeps_its_uid_from_every_later_run(
    start: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One run's cgroup cannot be removed (as one a process of the run stayed in): its uid
    # is never given back, so no later run gets it, released late or not.
    base = DEFAULT_UID_BASE + 820
    leases: list[UidLease] = []
    take, configure, remove = UidPool.take, cgroups.RunCgroup.configure, cgroups.RunCgroup.remove
    marking = False
    marked: list[cgroups.RunCgroup] = []
    stuck: list[cgroups.RunCgroup] = []

    def taken(pool: UidPool) -> UidLease:
        leases.append(take(pool))
        return leases[-1]

    def configured(group: cgroups.RunCgroup, limits: cgroups.CgroupLimits) -> None:
        configure(group, limits)
        if marking:
            marked.append(group)

    def refused(group: cgroups.RunCgroup, timeout: float = 5.0) -> bool:
        if group not in marked:
            return remove(group, timeout)
        stuck.append(group)
        group.unweigh()
        return False

    monkeypatch.setattr(UidPool, "take", taken)
    monkeypatch.setattr(cgroups.RunCgroup, "configure", configured)
    monkeypatch.setattr(cgroups.RunCgroup, "remove", refused)
    kept = None
    try:
        with on_a_range_of(6, base, start, tmp_path) as sandbox:
            local = local_of(sandbox)
            pool = uids_of(local)
            run_uid(sandbox, tmp_path / "root")  # a warm pool is ready after it
            marking = True
            kept = run_uid(sandbox, tmp_path / "root")
            marking = False
            assert local.releases.drain()
            assert stuck, "the run's cgroup was not removed by its release"
            assert kept in pool.held()
            later = [run_uid(sandbox, tmp_path / "root") for _ in range(6)]
            assert local.releases.drain()
            assert kept not in later
            assert kept in pool.held()
    finally:
        for group in stuck:
            remove(group, 5.0)
        for lease in leases:
            if lease.uid == kept:
                lease.release()
