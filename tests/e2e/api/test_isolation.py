"""Through the whole server: a worker sees nothing of the host, floom, or other runs, whether
its run started cold or from a warm process (worker.yml `warm: true`)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

PROBE = """\
import json, os, socket
from pathlib import Path

inputs = json.loads(Path("inputs.json").read_text())
targets = inputs["paths"].split("|")
seen = {}
for target in targets:
    try:
        seen[target] = Path(target).read_text()[:200]
    except Exception as exc:
        seen[target] = "DENIED " + type(exc).__name__
try:
    socket.create_connection(("127.0.0.1", inputs["port"]), timeout=2)
    seen["socket"] = "connected"
except OSError as exc:
    seen["socket"] = "DENIED " + type(exc).__name__
seen["env"] = sorted(os.environ)
seen["pid"] = os.getpid()
Path("result.json").write_text(json.dumps({"outputs": {"seen": seen}}))
"""


WARM_RUN_SECONDS = 60.0


@pytest.fixture(params=["cold", "warm"])
def start(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_started(
    api: httpx.Client, worker: str, inputs: dict[str, Any], start: str, pid_of: Any
) -> dict[str, Any]:
    """A finished run of `worker`; for `warm`, the first that started from a warm process
    (its script is its namespace's pid 1; the version's first runs start cold while its
    pool gets ready)."""
    deadline = time.monotonic() + WARM_RUN_SECONDS
    while True:
        run_id = api.post(f"/api/v1/workers/{worker}/runs", json={"inputs": inputs}).json()["id"]
        run = wait_for_run(api, run_id)
        if start == "cold" or run["status"] != "succeeded" or pid_of(run) == 1:
            return run
        assert time.monotonic() < deadline, "no run of the worker started warm"


@pytest.fixture
def marker_env(monkeypatch: pytest.MonkeyPatch) -> str:
    marker = "server-env-marker-5e8a"
    monkeypatch.setenv("FLOOM_PROVIDER_KEY_FOR_TEST", marker)
    return marker


def test_a_worker_cannot_read_host_files_floom_data_the_server_env_or_open_sockets(
    server: LiveServer, api: httpx.Client, tmp_path: Path, marker_env: str, start: str
) -> None:
    data_dir = server.ctx.settings.data_dir
    host_secret = tmp_path / "host-only.txt"
    host_secret.write_text("host secret")
    paths = [
        str(host_secret),
        str(data_dir / "secret.key"),
        str(data_dir / "floom.db"),
        "/proc/1/environ",
        "/etc/shadow",
        str(Path.home() / ".bashrc"),
    ]
    folder = make_worker(
        tmp_path / "probe",
        "name: probe\ninputs: {paths: {type: string}, port: {type: integer}}\n"
        f"outputs: {{seen: {{type: object}}}}\nwarm: {str(start == 'warm').lower()}\n",
        {"run.py": PROBE},
    )
    deploy_folder(api, folder)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        # The server itself reaches the listener; the sandbox must not.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        inputs = {"paths": "|".join(paths), "port": port}
        run = run_started(api, "probe", inputs, start, lambda r: r["outputs"]["seen"]["pid"])
    finally:
        listener.close()
    assert run["status"] == "succeeded", run
    seen = run["outputs"]["seen"]
    for p in paths:
        if p == "/proc/1/environ":
            assert marker_env not in seen[p]
            assert "FLOOM_SECRET_KEY" not in seen[p]
        else:
            assert seen[p].startswith("DENIED"), (p, seen[p])
    assert seen["socket"].startswith("DENIED")
    assert set(seen["env"]) <= {
        "FLOOM_RUN_ID",
        "FLOOM_ATTEMPT",
        "FLOOM_OUTPUT_DIR",
        "FLOOM_WORKER",
        "FLOOM_VERSION_ID",
        "PATH",
        "HOME",
        "LANG",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",
        "SHLVL",
        "_",
        "LC_CTYPE",
    }, seen["env"]
    assert os.environ["FLOOM_PROVIDER_KEY_FOR_TEST"] == marker_env


def test_a_run_sees_only_its_own_work_directory(
    server: LiveServer, api: httpx.Client, tmp_path: Path, start: str
) -> None:
    folder = make_worker(
        tmp_path / "peek",
        "name: peek\noutputs: {listing: {type: array}, runs_root: {type: string}, "
        f"pid: {{type: integer}}}}\nwarm: {str(start == 'warm').lower()}\n",
        {
            "run.py": "import json, os\nfrom pathlib import Path\n"
            "root = Path(os.getcwd()).parent\n"
            "listing = sorted(os.listdir('.'))\n"
            "try:\n    other = str(sorted(os.listdir(root)))\nexcept OSError as e:\n"
            "    other = 'DENIED'\n"
            "Path('result.json').write_text(json.dumps("
            "{'outputs': {'listing': listing, 'runs_root': other, 'pid': os.getpid()}}))\n"
        },
    )
    deploy_folder(api, folder)
    run = run_started(api, "peek", {}, start, lambda r: r["outputs"]["pid"])
    assert run["status"] == "succeeded", run
    assert run["outputs"]["listing"] == ["inputs.json", "run.py", "worker.yml"]
    assert str(server.ctx.settings.data_dir) not in run["outputs"]["runs_root"]
    assert "run_" not in run["outputs"]["runs_root"]
