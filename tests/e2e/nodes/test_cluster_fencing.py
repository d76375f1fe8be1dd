"""No split brain: a node that cannot renew its lease (paused, or cut off from PostgreSQL)
has its sandbox ended by its watchdog before another node may start the next attempt of a
`concurrency: 1` run, and the late end of its fenced attempt changes nothing."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.support.harness import deploy_folder, free_port, live_server, make_worker, wait_until
from tests.support.processes.cluster import NodeProcess
from tests.support.processes.tcp_proxy import TcpProxy

MANIFEST = """\
name: single
concurrency: 1
retries: {count: 2, backoff_seconds: 0}
outputs:
  attempt: {type: number}
limits:
  timeout_seconds: 300
"""

# Attempt 1 never ends on its own: it becomes a process whose command line names it, so the
# test finds it on the host. Later attempts succeed at once.
SCRIPT = """\
import json, os, sys
attempt = os.environ["FLOOM_ATTEMPT"]
if attempt == "1":
    marker = "fence-probe-" + os.environ["FLOOM_RUN_ID"] + "-1"
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", marker])
open("result.json", "w").write(json.dumps({"outputs": {"attempt": int(attempt)}}))
"""

LEASE = 3.0
SETTINGS = {
    "roles": "executor",
    "lease_seconds": str(LEASE),
    "lease_grace_seconds": "0.5",
    "reap_interval_seconds": "0.3",
    "executor_slots": "2",
}


def _marked(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _pids_cgroup(pid: int) -> Path | None:
    """The directory of the cgroup `pid` is in under the pids controller (v1) or v2."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "pids":
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/")
        if controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


class AliveWatch:
    """The last moment each of `pids` was seen running, by this host's wall clock, through
    pidfds. Each moment is read before the look that found the process still running, so
    it is never later than a moment the process lived: a watcher that lags (a loaded
    machine, the GIL) only makes it earlier, and cannot make the fence look late."""

    LOOK_SECONDS = 0.01

    def __init__(self, pids: list[int]) -> None:
        self.alive_at: dict[int, float] = {}
        self._fds = {pid: os.pidfd_open(pid) for pid in pids}
        self._stop = threading.Event()
        running = self._look(dict(self._fds))
        self._thread = threading.Thread(target=self._watch, args=(running,), daemon=True)
        self._thread.start()

    def _look(self, running: dict[int, int]) -> dict[int, int]:
        """Those of `running` still running, each noted alive at a time read before its look."""
        still = {}
        for pid, fd in running.items():
            before = time.time()
            if not self._gone(fd):
                self.alive_at[pid] = before
                still[pid] = fd
        return still

    def _watch(self, running: dict[int, int]) -> None:
        while running and not self._stop.wait(self.LOOK_SECONDS):
            running = self._look(running)

    @staticmethod
    def _gone(fd: int) -> bool:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))  # a pidfd reads as ready once its process has ended

    def running_now(self) -> list[int]:
        """The pids still running at this very call, asked of the kernel, not the thread."""
        return sorted(pid for pid, fd in self._fds.items() if not self._gone(fd))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for fd in self._fds.values():
            os.close(fd)


def _events(api: httpx.Client, run_id: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
    return items


def _started(api: httpx.Client, run_id: str, attempt: int) -> dict[str, object] | None:
    prefix = f"started attempt {attempt} of "
    for event in _events(api, run_id):
        if str(event["line"]).startswith(prefix):
            return event
    return None


def _taken(api: httpx.Client, run_id: str) -> float:
    """When a reaper took attempt 1's expired lease, by the clock of its node (read in the
    transaction that took it, so no later than the take; the next claim comes after)."""
    for event in _events(api, run_id):
        if event["attempt"] == 1 and "stopped (lease expired)" in str(event["line"]):
            return datetime.fromisoformat(str(event["ts"])).timestamp()
    raise AssertionError(f"no reaper took the lease of {run_id}: {_events(api, run_id)}")


def _stop(node: NodeProcess) -> None:
    if node.proc is not None and node.proc.poll() is None:
        os.killpg(node.proc.pid, signal.SIGCONT)
    node.stop()


def _split_brain_case(
    tmp_path: Path, database_url: str, a_url: str, *, isolate: str, proxy: TcpProxy | None
) -> None:
    with ExitStack() as stack:
        api_node = stack.enter_context(live_server(tmp_path / "api", database_url, roles="api"))
        api = stack.enter_context(api_node.client())
        a = NodeProcess(tmp_path / "nodeA", a_url, node_id="nodeA", **SETTINGS)
        stack.callback(_stop, a)
        a.start().wait_healthy()
        deploy_folder(api, make_worker(tmp_path / "w", MANIFEST, {"run.py": SCRIPT}))
        run_id = api.post("/api/v1/workers/single/runs", json={"inputs": {}}).json()["id"]
        marker = f"fence-probe-{run_id}-1"
        # Attempt 1 runs on A, the only executor yet.
        pids = wait_until(lambda: _marked(marker) or None, timeout=60)
        started_1 = _started(api, run_id, 1)
        assert started_1 is not None
        assert str(started_1["line"]).endswith(" on nodeA")
        group = _pids_cgroup(pids[0])
        assert group is not None, group
        assert group.name.startswith("run-"), group
        assert set(pids) <= {int(p) for p in (group / "cgroup.procs").read_text().split()}
        b = NodeProcess(tmp_path / "nodeB", database_url, node_id="nodeB", **SETTINGS)
        stack.callback(_stop, b)
        b.start().wait_healthy()
        alive = AliveWatch(pids)
        stack.callback(alive.close)
        assert set(alive.alive_at) == set(pids), "attempt 1 ended before A was cut off"

        assert a.proc is not None
        if isolate == "pause":
            os.killpg(a.proc.pid, signal.SIGSTOP)  # floom's whole process group
        else:
            assert proxy is not None
            proxy.cut()
        try:
            started_2 = wait_until(lambda: _started(api, run_id, 2), timeout=60)
            # A's attempt was over before B started the next one: every process of it had
            # ended when this test saw attempt 2 (asked of the kernel now), its cgroup held
            # nothing, and none was seen running once B had taken the lease.
            still = alive.running_now()
            assert still == [], f"attempt 1's processes {still} still ran in attempt 2"
            assert not group.exists() or not (group / "cgroup.procs").read_text().split()
            assert str(started_2["line"]).endswith(" on nodeB"), started_2
            taken = _taken(api, run_id)
            # Both times are this host's clock: B's, read in the transaction that took the
            # lease, and the watcher's, read before a look that found the process running.
            overlap = max(alive.alive_at.values()) - taken
            assert overlap < 0, f"attempt 1 ran on {overlap:.3f} s after node B took its lease"
            done = wait_until(
                lambda: (
                    (r := api.get(f"/api/v1/runs/{run_id}").json())["status"] == "succeeded" and r
                ),
                timeout=60,
            )
        finally:
            if isolate == "pause":
                os.killpg(a.proc.pid, signal.SIGCONT)
            elif proxy is not None:
                proxy.restore()
        # A, back, finds its attempt fenced: its late end is refused and changes nothing.
        wait_until(lambda: "its end" in a.log() and "not recorded" in a.log(), timeout=30)
        after = api.get(f"/api/v1/runs/{run_id}").json()
        assert (after["status"], after["attempt"], after["outputs"]) == (
            "succeeded",
            2,
            {"attempt": 2},
        ), after
        assert done["finished_at"] == after["finished_at"]
        events = _events(api, run_id)
        last_of_1 = max(int(str(e["seq"])) for e in events if e["attempt"] == 1)
        assert last_of_1 < int(str(started_2["seq"])), events
        assert _marked(marker) == []


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_paused_node_s_sandbox_ends_before_another_node_starts_the_next_attempt(
    tmp_path: Path, database_url: str
) -> None:
    _split_brain_case(tmp_path, database_url, database_url, isolate="pause", proxy=None)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_node_cut_off_from_postgres_has_its_sandbox_ended_before_the_next_attempt(
    tmp_path: Path, database_url: str
) -> None:
    url = make_url(database_url)
    proxy = TcpProxy(target=(url.host or "127.0.0.1", url.port or 5432), port=free_port())
    try:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        _split_brain_case(tmp_path, database_url, proxied, isolate="cut", proxy=proxy)
    finally:
        proxy.close()
