"""`floom blobs migrate|check` and `floom doctor` with a bucket, as an operator runs them: the
CLI in a subprocess, against a real SeaweedFS on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from floom.services.context import Context
from floom.services.runs import agent as agent_runs
from tests.support.harness import REPO, fast_settings
from tests.support.ports import free_port
from tests.support.processes.s3_server import S3Server


def _floom(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    base.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_blobs_migrate_and_check_from_the_command_line(tmp_path: Path, s3_server: S3Server) -> None:
    settings = s3_server.settings()
    data = tmp_path / "data"
    ctx = Context.open(fast_settings(data, f"sqlite:///{data / 'floom.db'}"))
    for n in range(3):
        agent_runs.put_blob(ctx, f"workspace {n}".encode())
    ctx.engine.dispose()
    env = {"FLOOM_DATA_DIR": str(data), **s3_server.env(settings)}
    moved = _floom(["blobs", "migrate", "--to", "s3", "--json"], env)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["moved"] == 3
    again = _floom(["blobs", "migrate", "--to", "s3", "--json"], env)
    assert json.loads(again.stdout)["moved"] == 0
    assert json.loads(again.stdout)["already"] == 3
    checked = _floom(["blobs", "check"], env)
    assert checked.returncode == 0
    assert "3 blob(s) checked, 0 problem(s)" in checked.stdout
    doctor = _floom(["doctor", "--json"], env)
    found = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert found["object store"]["status"] == "ok"
    assert found["object store writes"]["status"] == "ok"
    assert found["object store versioning"]["status"] == "warn"


def test_doctor_fails_an_unreachable_bucket_with_its_fix(tmp_path: Path) -> None:
    env = {
        "FLOOM_DATA_DIR": str(tmp_path / "data"),
        "FLOOM_BLOB_STORE": "s3",
        "FLOOM_S3_BUCKET": "floom",
        "FLOOM_S3_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "FLOOM_S3_ACCESS_KEY_ID": "k",
        "FLOOM_S3_SECRET_ACCESS_KEY": "never-printed-secret",
        "FLOOM_S3_TIMEOUT_SECONDS": "1",
    }
    doctor = _floom(["doctor"], env)
    assert doctor.returncode == 1
    assert "FAIL object store" in doctor.stdout
    assert "FLOOM_S3_ENDPOINT" in doctor.stdout
    assert "never-printed-secret" not in doctor.stdout + doctor.stderr
