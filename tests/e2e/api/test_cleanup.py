"""Removing what runs leave (floom/engine/cleanup.py): whatever a tree holds, nothing outside
it goes, with `rm` or without it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.engine import cleanup
from floom.sandbox.local.disks import unmount_under
from tests.support.harness import fast_settings, live_server

DEPTH = 1200  # past Python's recursion limit (1000), which ended shutil.rmtree


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path: Path) -> Iterator[None]:
    # Whatever a failing test leaves: pytest removes old temporary dirs with shutil.rmtree.
    yield
    subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


def _hostile_tree(top: Path, outside: Path) -> None:
    """What a run may leave: folders too deep to recurse into, links to a host file and folder
    at the top and the bottom, a FIFO, a folder and a file without rights, names an option
    parser would take."""
    top.mkdir()
    (top / "-rf").write_text("x")
    (top / "--one-file-system").mkdir()
    os.mkfifo(top / "pipe")
    locked = top / "locked"
    locked.mkdir()
    (locked / "inside.txt").write_text("x")
    (top / "no-rights.txt").write_text("x")
    (top / "no-rights.txt").chmod(0)
    fd = os.open(top, os.O_RDONLY)
    for level in range(DEPTH + 1):
        if level in (0, DEPTH):
            os.symlink(outside, "folder-link", dir_fd=fd)
            os.symlink(outside / "keep.txt", "file-link", dir_fd=fd)
        if level < DEPTH:
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    os.close(fd)
    locked.chmod(0)


@pytest.mark.parametrize("with_rm", [True, False], ids=["rm", "python"])
def test_trees_are_removed_whole_without_following_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_rm: bool
) -> None:
    if not with_rm:
        monkeypatch.setattr(cleanup, "_rm", lambda: None)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    trees = [tmp_path / "run-1.trash-a", tmp_path / "run-2.trash-b"]
    for top in trees:
        _hostile_tree(top, outside)
    (tmp_path / "plain-file").write_text("x")
    # A run dir whose disk was unmounted is an empty folder (removed without `rm`); a link
    # to an empty folder goes, the folder stays.
    (tmp_path / "run-3").mkdir()
    (outside / "empty").mkdir()
    (tmp_path / "run-4").symlink_to(outside / "empty")

    left = [tmp_path / name for name in ("plain-file", "never-there", "run-3", "run-4")]
    cleanup.remove_trees([*trees, *left])

    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside"]
    assert (outside / "keep.txt").read_text() == "kept"
    assert (outside / "empty").is_dir()


def test_the_python_removal_leaves_a_folder_taken_by_a_mount_and_the_rest_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    monkeypatch.setattr(cleanup, "_rm", lambda: None)
    top = tmp_path / "run.trash"
    (top / "a" / "mounted").mkdir(parents=True)
    (top / "a" / "file.txt").write_text("x")
    target = top / "a" / "mounted"
    mounted = tmp_path / "elsewhere"
    mounted.mkdir()
    (mounted / "theirs.txt").write_text("theirs")
    subprocess.run(["mount", "--bind", str(mounted), str(target)], check=True)
    try:
        cleanup.remove_trees([top])
        assert (mounted / "theirs.txt").read_text() == "theirs"
        assert not (top / "a" / "file.txt").exists()
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.parametrize("linked", [False, True], ids=["work-root", "linked-work-root"])
def test_a_server_starts_over_a_work_root_a_killed_one_left_a_deep_tree_in(
    tmp_path: Path, database_url: str, linked: bool
) -> None:
    # The executor empties its work root on start: a tree left by a run of a killed server
    # once raised RecursionError there, and no server could start on that data dir. A work
    # root an operator linked to another disk stays linked, emptied there.
    data_dir = tmp_path / "data"
    work_root = fast_settings(data_dir, database_url).work_root
    work_root.parent.mkdir(parents=True)
    if linked:
        (tmp_path / "other-disk").mkdir()
        work_root.symlink_to(tmp_path / "other-disk")
    else:
        work_root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    _hostile_tree(work_root / "run_left-1", outside)
    (work_root / "run_left-2.trash-0f").mkdir()

    with live_server(data_dir, database_url) as server, server.client() as client:
        assert client.get("/healthz").status_code == 200
        assert list(work_root.iterdir()) == []
        assert work_root.is_symlink() == linked
    assert (outside / "keep.txt").read_text() == "kept"


def test_a_server_starts_over_the_run_disks_a_killed_one_left_mounted(
    tmp_path: Path, database_url: str
) -> None:
    # A root floom mounts a disk of its own on each run dir (floom/sandbox/local/disks.py); one
    # killed mid-run leaves it mounted on the host, its image kept busy by the mount.
    from floom.sandbox.local.backend import LocalSandbox

    if not LocalSandbox().disks or not LocalSandbox().disks.usable():  # type: ignore[union-attr]
        pytest.skip("a run's own disk needs root and loop devices")
    data_dir = tmp_path / "data"
    work_root = fast_settings(data_dir, database_url).work_root
    left = work_root / "run_left-1"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from pathlib import Path;"
            "from floom.sandbox.local.backend import LocalSandbox;"
            "run_dir = Path(sys.argv[1]); LocalSandbox().make_run_dir(run_dir, disk_mb=8);"
            "(run_dir / 'work').mkdir(); (run_dir / 'work' / 'big').write_bytes(b'x' * 2**20);"
            "os.kill(os.getpid(), 9)",
            str(left),
        ],
        check=False,
    )
    assert killed.returncode == -9
    assert os.path.ismount(left)
    images = list((work_root / ".disks").glob("*.img"))
    assert images

    try:
        with live_server(data_dir, database_url) as server, server.client() as client:
            assert client.get("/healthz").status_code == 200
            assert not os.path.ismount(left)
            assert list(work_root.iterdir()) == []
        with open("/proc/self/mountinfo") as table:
            assert str(work_root) not in table.read()
    finally:
        unmount_under(work_root)  # whatever a failure left
