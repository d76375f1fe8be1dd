"""Script workers through a live floom server with FLOOM_SANDBOX=e2b, the real `e2b` SDK
pointed at the stand-in (tests/standins/e2b) by its own settings: the REST API's view of a run in
E2B (outputs, artifacts, logs, cancel). tests/integration/sandbox/test_sandbox_e2b.py covers the
backend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.standins.e2b import E2BStandin, e2b_standin  # noqa: F401 - the fixture
from tests.support.cli import cli
from tests.support.harness import deploy_folder, live_server, make_worker, wait_for_run, wait_until

SCRIPT = """\
import json, os, sys
from pathlib import Path
inputs = json.loads(Path("inputs.json").read_text())
for i in range(3):
    print(f"line {i}", flush=True)
print("careful", file=sys.stderr, flush=True)
Path(os.environ["FLOOM_OUTPUT_DIR"], "report.txt").write_text("report of " + inputs["name"])
outputs = {"files": len(os.listdir("lib")), "keys": sorted(k for k in os.environ if "E2B" in k)}
Path("result.json").write_text(json.dumps({"outputs": outputs}))
"""


@pytest.fixture
def api(tmp_path: Path, e2b_standin: E2BStandin) -> Iterator[httpx.Client]:  # noqa: F811
    # The server finds its E2B key in E2B_API_KEY, which the stand-in's fixture set.
    database = f"sqlite:///{tmp_path}/floom.db"
    with (
        live_server(tmp_path / "data", database, sandbox="e2b") as server,
        server.client() as client,
    ):
        yield client


def test_a_run_in_e2b_comes_back_with_outputs_artifacts_and_logs_in_one_sandbox(
    api: httpx.Client,
    e2b_standin: E2BStandin,  # noqa: F811
    tmp_path: Path,
) -> None:
    bundle = {f"lib/m{i}.py": f"X = {i}\n" for i in range(100)}
    folder = make_worker(
        tmp_path / "bundle",
        "name: bundle\ninputs: {name: {type: string}}\n"
        "outputs: {files: {type: integer}, keys: {type: array}}\n",
        {"run.py": SCRIPT, **bundle},
    )
    deployed = deploy_folder(api, folder)

    run_id = api.post("/api/v1/workers/bundle/runs", json={"inputs": {"name": "Ada"}}).json()["id"]
    run = wait_for_run(api, run_id)

    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"files": 100, "keys": ["E2B_SANDBOX", "E2B_SANDBOX_ID"]}
    assert [a["name"] for a in run["artifacts"]] == ["report.txt"]
    assert api.get(run["artifacts"][0]["url"]).text == "report of Ada"
    lines = [
        (e["stream"], e["line"]) for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
    ]
    assert [line for stream, line in lines if stream == "stdout"] == ["line 0", "line 1", "line 2"]
    assert ("stderr", "careful") in lines
    [sandbox] = e2b_standin.created
    assert {run_id, "bundle", deployed["version"]["id"]} <= set(sandbox.metadata.values())
    assert sandbox.template == "base"
    assert sandbox.allow_internet is False
    wait_until(lambda: e2b_standin.killed == [sandbox.sandbox_id], timeout=10)
    assert e2b_standin.requests["POST /files"] == 1
    assert e2b_standin.api_key not in api.get(f"/api/v1/runs/{run_id}").text


def test_cancelling_a_run_in_e2b_kills_its_sandbox_at_once(
    api: httpx.Client,
    e2b_standin: E2BStandin,  # noqa: F811
    tmp_path: Path,
) -> None:
    folder = make_worker(
        tmp_path / "sleepy",
        "name: sleepy\n",
        {"run.py": "import time\nprint('waiting', flush=True)\ntime.sleep(60)\n"},
    )
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/sleepy/runs", json={}).json()["id"]
    wait_until(
        lambda: any(
            e["line"] == "waiting" for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
        )
    )

    asked = time.monotonic()
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    wait_until(lambda: e2b_standin.sandboxes == {}, timeout=10)
    killed_after = time.monotonic() - asked

    assert wait_for_run(api, run_id, timeout=10)["status"] == "cancelled"
    assert killed_after < 3
    assert len(e2b_standin.killed) == 1


def test_with_e2b_warm_runs_start_in_sandboxes_made_ahead_shown_and_killed_with_the_node(
    e2b_standin: E2BStandin,  # noqa: F811
    tmp_path: Path,
) -> None:
    e2b_standin.creation_delay = 0.3
    database = f"sqlite:///{tmp_path}/floom.db"
    with live_server(tmp_path / "data", database, sandbox="e2b", e2b_warm=1) as server:
        with server.client() as api:
            folder = make_worker(
                tmp_path / "quick",
                "name: quick\noutputs: {box: {type: string}}\n",
                {"run.py": BOX_SCRIPT},
            )
            deploy_folder(api, folder)
            boxes = []
            for _ in range(3):
                run = wait_for_run(
                    api, api.post("/api/v1/workers/quick/runs", json={}).json()["id"]
                )
                assert run["status"] == "succeeded", run
                boxes.append(run["outputs"]["box"])
                wait_until(lambda: _ready(e2b_standin), timeout=10)
            assert len(set(boxes)) == 3  # never one sandbox for two runs
            wait_until(lambda: set(boxes) <= set(e2b_standin.killed), timeout=10)

            e2b = api.get("/healthz").json()["warm"]["e2b"]
            (pool,) = e2b["pools"]
            assert (pool["template"], pool["ready"], pool["hits"], pool["misses"]) == (
                "base",
                1,
                2,
                1,
            )
            _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="prom")
            with server.client(reader) as scraper:
                text = scraper.get("/metrics").text
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            assert samples[("floom_warm_e2b_hits_total", ())] == 2
            assert (
                samples[("floom_warm_e2b_ready", (("network", "off"), ("template", "base")))] == 1
            )
            listed = cli(server, "nodes")
            assert listed.returncode == 0, listed.stderr
            assert "E2B sandboxes ready ahead" in listed.stdout
        ready = _ready(e2b_standin)
        assert ready
    # The node stopped: what it kept ready is gone.
    wait_until(lambda: not _ready(e2b_standin), timeout=10)
    assert ready <= set(e2b_standin.killed)


BOX_SCRIPT = """\
import json, os
from pathlib import Path
Path("result.json").write_text(json.dumps({"outputs": {"box": os.environ["E2B_SANDBOX_ID"]}}))
"""


def _ready(standin: E2BStandin) -> set[str]:
    return {i for i, box in standin.sandboxes.items() if "floom_pool" in box.metadata}
