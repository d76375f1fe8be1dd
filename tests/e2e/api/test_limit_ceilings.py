"""An operator's ceilings on worker.yml's limits (FLOOM_MAX_MEMORY_MB, ...): a worker asking
for more than the server allows is refused at deploy, and validate says the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from floom.bundle import read_folder
from floom.services.workers.limit_ceilings import CEILINGS
from tests.support.harness import live_server, make_worker, wait_for_run

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

CEILING_SETTINGS: dict[str, Any] = {
    "max_timeout_seconds": 60,
    "max_memory_mb": 256,
    "max_processes": 64,
    "max_cpu": 0.5,
    "max_disk_mb": 100,
    "max_tool_iterations": 10,
}
# Each limit just over its ceiling, and what the refusal names.
OVER = {
    "timeout_seconds": ("61", "61 seconds", "60 seconds (FLOOM_MAX_TIMEOUT_SECONDS)"),
    "memory_mb": ("257", "257 MiB", "256 MiB (FLOOM_MAX_MEMORY_MB)"),
    "processes": ("65", "65 processes", "64 processes (FLOOM_MAX_PROCESSES)"),
    "cpu": ("0.75", "0.75 cores", "0.5 cores (FLOOM_MAX_CPU)"),
    "disk_mb": ("101", "101 MiB", "100 MiB (FLOOM_MAX_DISK_MB)"),
    "max_tool_iterations": ("11", "11 model turns", "10 model turns (FLOOM_MAX_TOOL_ITERATIONS)"),
}
AT = {
    "timeout_seconds": "60",
    "memory_mb": "256",
    "processes": "64",
    "cpu": "0.5",
    "disk_mb": "100",
    "max_tool_iterations": "10",
}


def limits_line(**values: str) -> str:
    return "limits: {" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}\n"


def _archive(tmp_path: Path, name: str, limits: str) -> bytes:
    folder = make_worker(tmp_path / name, f"name: {name}\n{limits}", {"run.py": "print(1)\n"})
    return read_folder(folder, max_bytes=1 << 20).to_archive()


def test_every_limit_of_worker_yml_has_a_ceiling_setting() -> None:
    assert sorted(c.key for c in CEILINGS) == sorted(OVER)
    assert sorted(c.attribute for c in CEILINGS) == sorted(CEILING_SETTINGS)


@on_sqlite
@pytest.mark.parametrize("key", sorted(OVER))
def test_a_limit_over_the_server_s_ceiling_is_refused_at_deploy_and_by_validate(
    tmp_path: Path, database_url: str, key: str
) -> None:
    value, asked, ceiling = OVER[key]
    archive = _archive(tmp_path, "greedy", limits_line(**{**AT, key: value}))
    headers = {"Content-Type": "application/gzip"}
    with (
        live_server(tmp_path / "data", database_url, **CEILING_SETTINGS) as server,
        server.client() as api,
    ):
        deployed = api.post("/api/v1/workers", content=archive, headers=headers)
        checked = api.post("/api/v1/workers/validate", content=archive, headers=headers)
        workers = api.get("/api/v1/workers").json()["items"]

    assert deployed.status_code == 400, deployed.text
    error = deployed.json()["error"]
    assert error["code"] == "manifest_invalid"
    [problem] = error["details"]
    assert problem["path"] == f"limits.{key}"
    assert problem["message"] == f"asks for {asked}, over this server's ceiling of {ceiling}"
    assert f"set limits.{key} to" in problem["hint"]
    assert workers == []  # nothing stored
    assert checked.status_code == 200
    assert checked.json()["valid"] is False
    assert checked.json()["problems"] == [problem]


@on_sqlite
def test_limits_at_the_ceilings_deploy_and_a_default_over_one_is_refused_naming_it(
    tmp_path: Path, database_url: str
) -> None:
    headers = {"Content-Type": "application/gzip"}
    at = _archive(tmp_path, "fits", limits_line(**AT))
    default = _archive(tmp_path, "plain", "")
    with (
        live_server(tmp_path / "data", database_url, **CEILING_SETTINGS) as server,
        server.client() as api,
    ):
        fits = api.post("/api/v1/workers", content=at, headers=headers)
        plain = api.post("/api/v1/workers", content=default, headers=headers)

    assert fits.status_code == 201, fits.text
    assert plain.status_code == 400
    paths = [p["path"] for p in plain.json()["error"]["details"]]
    assert paths == [
        "limits.timeout_seconds",
        "limits.memory_mb",
        "limits.processes",
        "limits.cpu",
        "limits.disk_mb",
    ]
    messages = [p["message"] for p in plain.json()["error"]["details"]]
    assert messages[1] == (
        "asks for 512 MiB (the default), over this server's ceiling of 256 MiB "
        "(FLOOM_MAX_MEMORY_MB)"
    )


@on_sqlite
def test_without_ceilings_the_largest_limits_worker_yml_allows_deploy(
    tmp_path: Path, database_url: str
) -> None:
    archive = _archive(
        tmp_path,
        "large",
        "limits: {timeout_seconds: 86400, memory_mb: 65536, processes: 65536, cpu: 256, "
        "disk_mb: 1048576}\n",
    )
    with live_server(tmp_path / "data", database_url) as server, server.client() as api:
        deployed = api.post(
            "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
        )
    assert deployed.status_code == 201, deployed.text


@on_sqlite
def test_a_rollback_to_a_version_over_a_ceiling_set_since_is_refused(
    tmp_path: Path, database_url: str
) -> None:
    headers = {"Content-Type": "application/gzip"}
    greedy = _archive(tmp_path, "w", limits_line(memory_mb="2048"))
    modest = _archive(tmp_path / "again", "w", limits_line(memory_mb="256"))
    with live_server(tmp_path / "data", database_url) as server, server.client() as api:
        first = api.post("/api/v1/workers", content=greedy, headers=headers).json()["version"]
        api.post("/api/v1/workers", content=modest, headers=headers).raise_for_status()
    with (
        live_server(tmp_path / "data", database_url, max_memory_mb=1024) as server,
        server.client() as api,
    ):
        back = api.post("/api/v1/workers/w/rollback", json={"version_id": first["id"]})
        active = api.get("/api/v1/workers/w").json()["active_version_id"]
    assert back.status_code == 400, back.text
    [problem] = back.json()["error"]["details"]
    assert problem["path"] == "limits.memory_mb"
    assert "ceiling of 1024 MiB (FLOOM_MAX_MEMORY_MB)" in problem["message"]
    assert active != first["id"]


@on_sqlite
def test_a_run_of_a_version_over_a_ceiling_set_since_fails_naming_it_and_starts_nothing(
    tmp_path: Path, database_url: str
) -> None:
    headers = {"Content-Type": "application/gzip"}
    greedy = _archive(tmp_path, "w", limits_line(memory_mb="2048"))
    with live_server(tmp_path / "data", database_url) as server, server.client() as api:
        api.post("/api/v1/workers", content=greedy, headers=headers).raise_for_status()
    with (
        live_server(tmp_path / "data", database_url, max_memory_mb=1024) as server,
        server.client() as api,
    ):
        run_id = api.post("/api/v1/workers/w/runs", json={}).json()["id"]
        run = wait_for_run(api, run_id)
    assert run["status"] == "failed", run
    assert run["error"]["code"] == "sandbox_unavailable"
    assert run["error"]["message"].startswith(
        "this run asks for 2048 (limits.memory_mb), over this node's ceiling of 1024 "
        "(FLOOM_MAX_MEMORY_MB)"
    )
    assert run["attempt"] == 1  # not retried: trying again cannot help
