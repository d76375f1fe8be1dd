"""A hostile run against what the node has only one of: kernel pools counted machine-wide
which no cgroup of the run bounds. Each is refused or bounded per run, cold and warm, so one
run cannot take what every other sandbox (and container) on the node needs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.sandbox import SandboxResult
from floom.sandbox.base import Sandbox
from floom.sandbox.local.warm.inside import PTYS_PER_RUN
from tests.support.rigs.sandboxes import Lines, run_script
from tests.support.rigs.warm import WarmedLocal, cold_or_warm, warm_script_spec

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs as their own uids need a root floom"),
]


@pytest.fixture(params=["cold", "warm"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    with cold_or_warm(request.param, tmp_path) as sandbox:
        yield sandbox


def run(sandbox: Sandbox, tmp_path: Path, script: str) -> tuple[SandboxResult, dict[str, object]]:
    if isinstance(sandbox, WarmedLocal):
        spec = warm_script_spec(sandbox.work_root, script, timeout_seconds=30.0)
        lines: Lines = []
        result = sandbox.run(
            spec, on_line=lambda s, line: lines.append((s, line)), should_cancel=lambda: False
        )
    else:
        result, lines = run_script(sandbox, tmp_path, script)
    found = [json.loads(line) for stream, line in lines if stream == "stdout" and "{" in line]
    assert found, lines
    return result, found[-1]


AIO = """
import ctypes, errno, json, platform
libc = ctypes.CDLL(None, use_errno=True)
io_setup = {"x86_64": 206, "aarch64": 0}[platform.machine()]
context = ctypes.c_ulong(0)
rv = libc.syscall(io_setup, 65536, ctypes.byref(context))
print(json.dumps({"io_setup": errno.errorcode.get(ctypes.get_errno(), "ok") if rv else "ok"}))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="by number")
def test_a_run_cannot_take_the_machine_s_async_io_contexts(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """io_setup draws on fs.aio-max-nr (65536 events for the whole machine): one call of a
    run took them all, and every other program's io_setup failed with EAGAIN meanwhile."""
    result, seen = run(sandbox, tmp_path, AIO)

    assert result.exit_code == 0, seen
    assert seen == {"io_setup": "EPERM"}


PTYS = """
import json, os
held = []
failed = None
try:
    for _ in range(5000):
        held.append(os.openpty())
except OSError as exc:
    failed = exc.strerror
print(json.dumps({"ptys": len(held), "failed": failed, "listed": len(os.listdir("/dev/pts"))}))
"""


def test_a_run_holds_at_most_its_own_share_of_the_machine_s_ptys(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """kernel.pty.max counts every devpts instance's ptys together (4096, 1024 of them kept
    for the host's own): a run that opened ptys until refused took all 3072 others, and no
    other sandbox or container on the node could open one until it ended."""
    result, seen = run(sandbox, tmp_path, PTYS)

    assert result.exit_code == 0, seen
    assert seen["ptys"] == PTYS_PER_RUN  # a run still gets ptys, up to its own limit
    assert seen["failed"] == "No space left on device"
    assert seen["listed"] == PTYS_PER_RUN + 1  # its own, and ptmx: an instance of its own


HUGE_PAGES = """
import errno, json, mmap, os
seen = {}
def tried(name, call):
    try:
        call()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
anonymous = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
tried("mmap", lambda: mmap.mmap(-1, 2 << 20, flags=anonymous))
tried("mmap-hugetlb", lambda: mmap.mmap(-1, 2 << 20, flags=anonymous | 0x40000))
tried("memfd", lambda: os.close(os.memfd_create("plain")))
tried("memfd-hugetlb", lambda: os.close(os.memfd_create("huge", os.MFD_HUGETLB)))
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="by number")
def test_a_run_cannot_take_the_machine_s_huge_pages(sandbox: Sandbox, tmp_path: Path) -> None:
    """Huge pages come from a machine-wide pool (vm.nr_hugepages) that the run's memory
    cgroup does not count: with 8 set aside, a run's mmap(MAP_HUGETLB) took them, and an
    overcommitted one would pass its memory limit. Refused with EPERM, ordinary pages not."""
    result, seen = run(sandbox, tmp_path, HUGE_PAGES)

    assert result.exit_code == 0, seen
    assert seen == {"mmap": "ok", "mmap-hugetlb": "EPERM", "memfd": "ok", "memfd-hugetlb": "EPERM"}
