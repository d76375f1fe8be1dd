"""Releasing what a run held off its slot's path (floom/sandbox/releases.py), for real under
bubblewrap: the next run goes on while a release is pending, and nothing the release frees
(the run's uid, its run dir) is taken again before it is done."""

from __future__ import annotations

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
from floom.sandbox.local.uid_pool import UidPool
from tests.support.harness import wait_until
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
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid:
            found.append(int(entry))
    return found


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
    with cold_or_warm("warm", tmp_path) as sandbox:
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
    # counted too would take CPU from floom's own threads (the server) meanwhile.
    parent = cgroups.detect().parents.get(cgroups.CPU)
    if parent is None:
        pytest.skip("no CPU controller for runs here")
    file = parent / ("cpu.weight" if cgroups.detect().version == 2 else "cpu.shares")
    alone = file.read_text().strip()
    local = local_of(sandbox)
    gate = threading.Event()
    local.releases.add(lambda: gate.wait(30))
    try:
        run_uid(sandbox, tmp_path / "root")
        run_uid(sandbox, tmp_path / "root")
        assert local.releases.pending() >= 3  # the gate and both runs' releases
        assert file.read_text().strip() == alone
    finally:
        gate.set()
    assert local.releases.drain()
    assert file.read_text().strip() == alone
