"""Each running local sandbox has a host uid of its own (floom/sandbox/local/uid_pool.py): runs
share no per-uid kernel counter, and a uid goes back to the range when its run ended."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from floom.sandbox import LocalSandbox, SandboxResult
from floom.sandbox.base import SandboxUnavailable
from floom.sandbox.local.uid_pool import DEFAULT_UID_BASE, UidPool, UidRange
from tests.support.rigs.sandboxes import Lines, run_script

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes change uid only when floom is root"),
]

# Holds its uid's whole allowance of inotify instances until the test lets it go.
HOG = """
import ctypes, os, resource, time
# As many descriptors as allowed: the uid's allowance of instances, not the process's
# descriptors, should run out (fs.inotify.max_user_instances, 128 by default).
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
libc = ctypes.CDLL(None, use_errno=True)
held = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
print("uid", os.getuid(), flush=True)
print("held", len(held), "errno", ctypes.get_errno(), flush=True)
deadline = time.monotonic() + 30
while not os.path.exists("/output/go") and time.monotonic() < deadline:
    time.sleep(0.01)
"""
PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print("uid", os.getuid(), flush=True)
print("inotify", "ok" if fd >= 0 else f"errno {ctypes.get_errno()}", flush=True)
"""


def _stdout(lines: Lines) -> list[str]:
    return [line for stream, line in lines if stream == "stdout"]


def _run_while_the_hog_runs(tmp_path: Path, sandbox: LocalSandbox) -> tuple[Lines, Lines]:
    """The hog's lines and the probe's, the probe run while the hog holds its instances."""
    full = threading.Event()
    hog: dict[str, tuple[SandboxResult, Lines]] = {}

    def on_line(_stream: str, line: str) -> None:
        if line.startswith("held "):
            full.set()

    def run_hog() -> None:
        hog["ran"] = run_script(sandbox, tmp_path / "hog", HOG, on_line=on_line)

    (tmp_path / "hog").mkdir()
    (tmp_path / "probe").mkdir()
    thread = threading.Thread(target=run_hog)
    thread.start()
    try:
        assert full.wait(30), "the hog never filled its inotify allowance"
        probe_result, probe_lines = run_script(sandbox, tmp_path / "probe", PROBE)
        assert probe_result.exit_code == 0, probe_lines
    finally:
        (tmp_path / "hog" / "output" / "go").write_text("")
        thread.join(60)
    hog_result, hog_lines = hog["ran"]
    assert hog_result.exit_code == 0, hog_lines
    return hog_lines, probe_lines


def test_two_concurrent_runs_have_different_host_uids_and_do_not_share_inotify_instances(
    tmp_path: Path,
) -> None:
    sandbox = LocalSandbox()
    hog, probe = _run_while_the_hog_runs(tmp_path, sandbox)

    hog_uid, held = _stdout(hog)
    assert held.startswith("held "), held
    assert held.endswith("errno 24"), held  # EMFILE: all used
    probe_uid, inotify = _stdout(probe)
    assert inotify == "inotify ok"
    assert hog_uid != probe_uid
    for line in (hog_uid, probe_uid):
        uid = int(line.split()[1])
        assert DEFAULT_UID_BASE <= uid < DEFAULT_UID_BASE + UidRange().count


def test_a_run_s_uid_is_given_back_when_it_ends(tmp_path: Path) -> None:
    uids = UidRange(base=DEFAULT_UID_BASE + 500, count=2)
    pool = UidPool(uids)
    sandbox = LocalSandbox(uids=uids)
    seen = []
    try:
        for number in range(5):
            (tmp_path / str(number)).mkdir()
            result, lines = run_script(sandbox, tmp_path / str(number), PROBE)
            assert result.exit_code == 0, lines
            seen.append(int(_stdout(lines)[0].split()[1]))
            # A range just large enough for the node's slots (two uids for its one): the
            # run's slot released it itself, none being left to spare for a late release.
            assert pool.held() == set()
    finally:
        sandbox.close()
    # Five runs one after another on a range of two: each took a uid back from the range.
    assert set(seen) == {uids.base, uids.base + 1}


def test_a_run_finds_no_uid_while_every_uid_of_the_range_is_held(tmp_path: Path) -> None:
    uids = UidRange(base=DEFAULT_UID_BASE + 600, count=1)
    held = UidPool(uids).take()
    try:
        with pytest.raises(SandboxUnavailable, match="all 1 sandbox uids"):
            run_script(LocalSandbox(uids=uids), tmp_path, PROBE)
    finally:
        held.release()
    result, lines = run_script(LocalSandbox(uids=uids), tmp_path, PROBE)
    assert result.exit_code == 0, lines
    assert _stdout(lines)[0] == f"uid {uids.base}"


@pytest.mark.parametrize(
    ("uids", "named"),
    [
        (UidRange(base=0, count=10), "must lie within"),
        (UidRange(base=2**31 - 5, count=10), "must lie within"),
        (UidRange(base=65000, count=1000), "of user"),  # nobody: 65534
        (UidRange(base=1, count=5), "uid of user"),
    ],
)
def test_a_range_holding_a_user_of_this_machine_or_out_of_bounds_is_refused_at_check(
    uids: UidRange, named: str
) -> None:
    with pytest.raises(SandboxUnavailable, match=named) as caught:
        LocalSandbox(uids=uids).check()
    assert "FLOOM_SANDBOX_UID_BASE" in (caught.value.hint or "")


def test_a_range_holding_floom_s_own_uid_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: DEFAULT_UID_BASE + 3)
    problem = UidRange().problem()
    assert problem is not None
    assert "floom's own uid" in problem
