"""A run's work dir: the version's files are never copied per run where the local sandbox
lays the run's own layer over floom's cached copy, and whatever a script does to them
stays in its own run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.sandbox.base import SandboxSpec
from floom.sandbox.local.backend import LocalSandbox
from floom.services.access.principal import SYSTEM
from floom.services.runs.logs import list_events
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

# What a hostile script does to the version's files after printing what it found.
SCRIPT = """import json, os
from pathlib import Path
seen = {
    "data": Path("data.txt").read_text(),
    "sub": Path("sub/x.txt").read_text(),
    "keep": Path("keep.txt").exists(),
    "new": Path("new.txt").exists(),
    "mode": oct(os.stat("data.txt").st_mode & 0o777),
    "layered": any(
        line.split()[4] == "/work" and " - overlay " in line
        for line in open("/proc/self/mountinfo")
    ),
}
print("SEEN " + json.dumps(seen, sort_keys=True), flush=True)
with open("data.txt", "a") as f:
    f.write("tampered\\n")
try:  # refused where the file is the layer's (root's, under a run uid of its own)
    os.chmod("data.txt", 0o777)
except PermissionError:
    pass
Path("sub/x.txt").write_text("tampered\\n")
os.remove("keep.txt")
os.symlink("/etc/passwd", "sub/link")
Path("new.txt").write_text("left behind\\n")
Path("result.json").write_text(json.dumps({"outputs": {}}))
"""
FILES = {"run.py": SCRIPT, "data.txt": "original\n", "sub/x.txt": "shipped\n", "keep.txt": "k\n"}


def seen_by(server: LiveServer, run_id: str) -> dict[str, Any]:
    events = list_events(server.ctx, caller=SYSTEM, run_id=run_id)
    lines = [e.line for e in events if e.stream == "stdout"]
    found: dict[str, Any] = json.loads(lines[0].removeprefix("SEEN "))
    return found


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_script_cannot_change_the_version_s_files_for_the_next_run(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "tamper", "name: tamper\n", FILES))
    seen = []
    for _ in range(2):
        run_id = api.post("/api/v1/workers/tamper/runs", json={}).json()["id"]
        run = wait_for_run(api, run_id)
        assert run["status"] == "succeeded", run
        seen.append(seen_by(server, run_id))
    original = {"data": "original\n", "sub": "shipped\n", "keep": True, "new": False}
    assert seen[0] == seen[1]
    assert {k: v for k, v in seen[1].items() if k not in ("mode", "layered")} == original
    # Not copied per run where the sandbox can lay the run's layer over the cached copy.
    assert seen[1]["layered"] is LocalSandbox().layers_files
    # floom's cached copy of the version, which later runs start from, is as deployed.
    (cached,) = (server.ctx.settings.data_dir / "versions").iterdir()
    assert sorted(p.relative_to(cached).as_posix() for p in cached.rglob("*")) == sorted(
        ["data.txt", "keep.txt", "run.py", "sub", "sub/x.txt", "worker.yml"]
    )
    assert (cached / "data.txt").read_text() == "original\n"
    assert (cached / "sub" / "x.txt").read_text() == "shipped\n"
    assert oct((cached / "data.txt").stat().st_mode & 0o777) == seen[1]["mode"]


@pytest.mark.parametrize("dir_name", ["plain", "odd,name:with\\separators"])
def test_the_local_sandbox_lays_the_work_dir_over_the_version_s_files(
    tmp_path: Path, dir_name: str
) -> None:
    sandbox = LocalSandbox()
    if not sandbox.layers_files:
        pytest.skip("the work dir is layered only when floom runs as root")
    root = tmp_path / dir_name
    files, workdir, output = root / "versions" / "v1", root / "r" / "work", root / "r" / "output"
    for path in (files / "sub", workdir, output):
        path.mkdir(parents=True)
    (files / "data.txt").write_text("original\n")
    (files / "sub" / "x.txt").write_text("shipped\n")
    (workdir / "inputs.json").write_text("{}")
    script = (
        "cat data.txt sub/x.txt inputs.json; echo; echo more >> data.txt; rm sub/x.txt; "
        "echo new > new.txt"
    )
    lines: list[str] = []
    spec = SandboxSpec(
        run_id="run_layer",
        command=["sh", "-c", script],
        workdir=workdir,
        output_dir=output,
        files=files,
        timeout_seconds=30,
    )
    result = sandbox.run(spec, on_line=lambda _s, line: lines.append(line), should_cancel=bool)
    assert result.exit_code == 0, lines
    assert lines == ["original", "shipped", "{}"]
    # The writes landed in the run's layer; the version's files are as they were.
    assert (workdir / "data.txt").read_text() == "original\nmore\n"
    assert (workdir / "new.txt").read_text() == "new\n"
    assert (files / "data.txt").read_text() == "original\n"
    assert (files / "sub" / "x.txt").read_text() == "shipped\n"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_s_mount_table_names_no_path_of_the_host(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # The sandbox's mount table once named the data dir (the overlay's layers, the output
    # dir's bind), which told a script where its files sat on the host.
    if not LocalSandbox().layers_files:
        pytest.skip("the stage's mounts are a root floom's")
    script = "print(open('/proc/self/mountinfo').read())\nopen('result.json', 'w').write('{}')\n"
    deploy_folder(api, make_worker(tmp_path / "mounts", "name: mounts\n", {"run.py": script}))
    run_id = api.post("/api/v1/workers/mounts/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded", run

    events = list_events(server.ctx, caller=SYSTEM, run_id=run_id)
    table = "\n".join(e.line for e in events if e.stream == "stdout")
    assert " /work " in table
    assert " /output " in table
    settings = server.ctx.settings
    for host_path in (settings.data_dir, settings.work_root, tmp_path):
        for spelled in {str(host_path), os.path.realpath(host_path)}:
            assert spelled not in table, table
