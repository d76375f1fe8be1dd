"""Fault tests on the cluster that docker-compose.yml declares (bubblewrap profile: the api
node with the api and scheduler roles, two executor nodes), run as local processes on a
fresh PostgreSQL database reached through a TCP proxy the outage test cuts.

One cluster serves the module's tests, in order (the kill -9 test is last: it leaves one
executor dead). Settings added to the compose file's, for speed only: a 5 s lease with
heartbeats and reaper passes every 0.5 s (the defaults are 30 s, 2 s, 5 s).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from floom.sandbox.local.backend import owner_prefix
from floom.services.runs.statuses import FINISHED
from tests.support.harness import EXAMPLES, deploy_folder, free_port, make_worker, wait_until
from tests.support.processes.compose import Cluster, Node, compose_cluster
from tests.support.processes.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.cluster]

LEASE = 5.0
REAP = 0.5
FAST = {
    "FLOOM_LEASE_SECONDS": str(LEASE),
    "FLOOM_HEARTBEAT_SECONDS": "0.5",
    "FLOOM_REAP_INTERVAL_SECONDS": str(REAP),
}
STARTED = re.compile(r"^started attempt (\d+) of \d+ on (\S+)$")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pg_available: bool
) -> Iterator[tuple[Cluster, TcpProxy]]:
    if not pg_available:
        pytest.skip("PostgreSQL not reachable on 127.0.0.1:5432")
    proxy = TcpProxy(target=("127.0.0.1", 5432), port=free_port())
    try:
        with compose_cluster(
            tmp_path_factory.mktemp("cluster"),
            profile="bwrap",
            extra_env=FAST,
            database_port=proxy.port,
        ) as running:
            yield running, proxy
    finally:
        proxy.close()


def node_ids(c: Cluster) -> dict[str, str]:
    return {name: httpx.get(f"{n.url}/healthz").json()["node"] for name, n in c.nodes.items()}


def finished_count(c: Cluster, worker: str) -> int:
    rows = c.sql(
        "SELECT count(*) FROM runs WHERE worker_name = %s AND status = ANY(%s)",
        worker,
        sorted(FINISHED),
    )
    return int(rows[0][0])


def starts_by_run(c: Cluster, worker: str) -> dict[str, list[tuple[int, str]]]:
    """Each run's "started attempt N of M on NODE" events: one per claim."""
    rows = c.sql(
        "SELECT e.run_id, e.line FROM run_events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.worker_name = %s AND e.stream = 'system' AND e.line LIKE 'started attempt %%'",
        worker,
    )
    found: dict[str, list[tuple[int, str]]] = {}
    for run_id, line in rows:
        m = STARTED.match(line)
        assert m is not None, line
        found.setdefault(run_id, []).append((int(m.group(1)), m.group(2)))
    return found


def submit(api: httpx.Client, worker: str, count: int) -> list[str]:
    def one(_: int) -> str:
        resp = api.post(f"/api/v1/workers/{worker}/runs", json={"inputs": {}})
        assert resp.status_code == 202, resp.text
        return str(resp.json()["id"])

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(count)))


def test_the_compose_cluster_starts_with_one_admin_key_and_one_set_of_examples(
    cluster: tuple[Cluster, TcpProxy],
) -> None:
    c, _ = cluster
    # Three nodes started at once on an empty database.
    assert c.sql("SELECT count(*) FROM api_keys") == [(1,)]
    shipped = {p.name for p in EXAMPLES.iterdir() if (p / "worker.yml").is_file()}
    versions = dict(c.sql("SELECT worker_name, count(*) FROM versions GROUP BY worker_name"))
    assert versions == {name: 1 for name in shipped}
    with c.api() as api:
        nodes = {n["id"]: n for n in api.get("/api/v1/nodes").json()["items"]}
    ids = node_ids(c)
    assert {nodes[ids[name]]["state"] for name in ids} == {"live"}
    assert nodes[ids["api"]]["roles"] == ["api", "scheduler"]
    assert nodes[ids["executor-bwrap-1"]]["roles"] == ["executor"]
    # The executor nodes serve health checks only.
    assert httpx.get(f"{c.nodes['executor-bwrap-1'].url}/api/v1/runs").status_code == 404


def test_300_runs_submitted_on_the_api_node_each_run_exactly_once_across_both_executors(
    cluster: tuple[Cluster, TcpProxy], tmp_path: Path
) -> None:
    c, _ = cluster
    ids = node_ids(c)
    folder = make_worker(
        tmp_path / "tick",
        "name: tick\n",
        {"run.sh": 'echo "sandbox started $FLOOM_RUN_ID $FLOOM_ATTEMPT"\n'},
    )
    with c.api() as api:
        deploy_folder(api, folder)
        began = time.monotonic()
        run_ids = submit(api, "tick", 300)
    wait_until(lambda: finished_count(c, "tick") == 300, timeout=240, interval=0.5)
    elapsed = time.monotonic() - began
    print(
        f"\n300 trivial runs through the compose cluster: {elapsed:.1f} s, "
        f"{300 / elapsed:.1f} runs/s"
    )

    assert len(set(run_ids)) == 300
    outcome = c.sql(
        "SELECT status, attempt, count(*) FROM runs WHERE worker_name = 'tick' "
        "GROUP BY status, attempt"
    )
    assert outcome == [("succeeded", 1, 300)]
    starts = starts_by_run(c, "tick")
    assert set(starts) == set(run_ids)
    assert all(len(s) == 1 for s in starts.values())
    by_node: dict[str, int] = {}
    for ((_, node),) in starts.values():
        by_node[node] = by_node.get(node, 0) + 1
    assert set(by_node) == {ids["executor-bwrap-1"], ids["executor-bwrap-2"]}, by_node
    print(f"claims per executor: {sorted(by_node.values())}")
    # Each sandbox start printed one line: no run's script ran twice.
    sandbox_lines = c.sql(
        "SELECT e.run_id, count(*) FROM run_events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.worker_name = 'tick' AND e.stream = 'stdout' GROUP BY e.run_id"
    )
    assert len(sandbox_lines) == 300
    assert {n for _, n in sandbox_lines} == {1}


def test_an_unreachable_database_gives_503s_and_logs_and_in_flight_results_are_kept(
    cluster: tuple[Cluster, TcpProxy], tmp_path: Path
) -> None:
    c, proxy = cluster
    folder = make_worker(
        tmp_path / "outage",
        "name: outage\noutputs: {done: {type: boolean, required: true}}\n",
        {
            "run.sh": "echo before\nsleep 3\necho after\n"
            'echo \'{"outputs": {"done": true}}\' > result.json\n'
        },
    )
    api = c.api()
    deploy_folder(api, folder)
    run_ids = submit(api, "outage", 2)
    # Both scripts have started (their first line is stored): the runs are in flight.
    wait_until(
        lambda: (
            c.sql(
                "SELECT count(*) FROM run_events e JOIN runs r ON r.id = e.run_id "
                "WHERE r.worker_name = 'outage' AND r.status = 'running' AND e.line = 'before'"
            )
            == [(2,)]
        ),
        timeout=30,
    )
    proxy.cut()
    try:
        health = httpx.get(f"{c.nodes['api'].url}/healthz", timeout=10)
        assert health.status_code == 503
        assert health.json()["error"]["code"] == "store_unavailable"
        for resp in (
            api.get("/api/v1/runs"),
            api.post("/api/v1/workers/outage/runs", json={"inputs": {}}),
        ):
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "store_unavailable"
            assert "Traceback" not in resp.text
        # Every node says so in its log; the executors hold the finished runs' results.
        for node in c.nodes.values():

            def said(node: Node = node) -> bool:
                return "database unreachable" in node.log()

            wait_until(said, timeout=15)

        def results_held() -> bool:
            logs = "".join(n.log() for n in c.nodes.values())
            return all(f"recording the end of {r} failed" in logs for r in run_ids)

        wait_until(results_held, timeout=30)
    finally:
        proxy.restore()
    wait_until(lambda: finished_count(c, "outage") == 2, timeout=30)
    rows = c.sql(
        "SELECT status, attempt, error_code, error_message FROM runs WHERE worker_name = 'outage'"
    )
    # Recorded, not run again.
    assert rows == [("succeeded", 1, None, None)] * 2, (rows, c.nodes["executor-bwrap-1"].log())
    for run_id in run_ids:
        body = api.get(f"/api/v1/runs/{run_id}").json()
        assert body["outputs"] == {"done": True}
        lines = [e["line"] for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]]
        assert "before" in lines
        assert "after" in lines
    assert httpx.get(f"{c.nodes['api'].url}/healthz").status_code == 200
    wait_until(lambda: all("database reachable again" in n.log() for n in c.nodes.values()))
    api.close()


def test_kill_9_of_an_executor_reruns_or_fails_its_runs_within_lease_and_reap_and_leaves_no_sandbox(
    cluster: tuple[Cluster, TcpProxy], tmp_path: Path
) -> None:
    c, _ = cluster
    ids = node_ids(c)
    doomed, survivor = c.nodes["executor-bwrap-1"], c.nodes["executor-bwrap-2"]
    for name, retries, script in (
        ("again", 1, 'echo in flight\n[ "$FLOOM_ATTEMPT" = 1 ] && sleep 120\necho finished\n'),
        ("once", 0, "echo in flight\nsleep 120\n"),
    ):
        folder = make_worker(
            tmp_path / name, f"name: {name}\nretries: {retries}\n", {"run.sh": script}
        )
        with c.api() as api:
            deploy_folder(api, folder)
    survivor.pause()  # so that the doomed node claims all four runs
    try:
        with c.api() as api:
            again = submit(api, "again", 3)
            once = submit(api, "once", 1)
        try:
            wait_until(
                lambda: (
                    c.sql(
                        "SELECT count(*) FROM runs WHERE status = 'running' AND lease_owner = %s",
                        ids["executor-bwrap-1"],
                    )
                    == [(4,)]
                ),
                timeout=30,
            )
        except AssertionError:
            # Seen once in CI under load, not since: say where the four runs were.
            rows = c.sql(
                "SELECT id, status, attempt, lease_owner, error_code FROM runs "
                "WHERE worker_name IN ('again', 'once')"
            )
            raise AssertionError(
                f"the doomed node holds not all four runs: {rows}\n{doomed.log()[-6000:]}"
            ) from None
        # Every script has started (its first line is stored): four sandboxes in flight.
        wait_until(
            lambda: c.sql("SELECT count(*) FROM run_events WHERE line = 'in flight'") == [(4,)],
            timeout=30,
        )
        work_root = str(doomed.data_dir / "runs")
        assert sandbox_pids(work_root)
    finally:
        survivor.signal(signal.SIGCONT)
    doomed.kill9()
    killed_at = time.monotonic()

    def settled() -> bool:
        return finished_count(c, "again") == 3 and finished_count(c, "once") == 1

    wait_until(settled, timeout=LEASE + REAP + 30, interval=0.2)
    took = time.monotonic() - killed_at
    print(
        f"\nruns of the killed executor settled {took:.1f} s after kill -9 "
        f"(lease {LEASE} s + reap interval {REAP} s)"
    )
    assert took < LEASE + REAP + 10
    with c.api() as api:
        for run_id in again:
            run = api.get(f"/api/v1/runs/{run_id}").json()
            assert (run["status"], run["attempt"]) == ("succeeded", 2), run
        lost = api.get(f"/api/v1/runs/{once[0]}").json()
        assert (lost["status"], lost["error"]["code"]) == ("failed", "executor_lost"), lost
        nodes = {n["id"]: n["state"] for n in api.get("/api/v1/nodes").json()["items"]}
    starts = starts_by_run(c, "again")
    assert all(
        s == [(1, ids["executor-bwrap-1"]), (2, ids["executor-bwrap-2"])]
        for s in (sorted(v) for v in starts.values())
    ), (starts, ids)
    assert c.sql("SELECT count(*) FROM runs WHERE status = 'running'") == [(0,)]
    assert nodes[ids["executor-bwrap-1"]] == "lost"
    assert nodes[ids["executor-bwrap-2"]] == "live"
    try:
        wait_until(lambda: not sandbox_pids(work_root), timeout=15)
    except AssertionError:
        left = {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in sandbox_pids(work_root)}
        raise AssertionError(f"sandbox processes left behind: {left}") from None


def sandbox_pids(work_root: str) -> list[int]:
    """The bwrap processes (the sandboxes' outer and pid 1) started for runs under
    `work_root`: floom names the run in a word of their command line (owner_marker)."""
    prefix = os.fsencode(owner_prefix(Path(work_root)))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"bwrap") and any(a.startswith(prefix) for a in argv):
            found.append(int(entry))
    return found
