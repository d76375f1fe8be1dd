"""The sandbox boundary: what a worker leaves in its work and output dirs (links, FIFOs,
sparse files, huge trees) never makes floom read a host file, hang or balloon; through real
bubblewrap runs on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.standins.anthropic_api import reply, tool_use
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run, wait_until
from tests.support.rigs.agents import (
    AgentRig,
    agent_rig,
    agent_worker,
    log_lines,
    start_run,
    wait_status,
)

LEAVER_YML = """\
name: leaver
inputs: {attack: {type: string, required: true}, host: {type: string}}
limits: {timeout_seconds: 15}
"""
LEAVER_PY = """\
import json, os
inp = json.load(open("inputs.json"))
attack, host = inp["attack"], inp.get("host", "")
out = os.environ["FLOOM_OUTPUT_DIR"]
if attack.startswith("artifact") or attack == "many-entries":
    json.dump({"outputs": {}}, open("result.json", "w"))
    open(out + "/kept.txt", "w").write("kept")
if attack == "result-host-link":
    os.symlink(host, "result.json")
elif attack == "result-dev-zero":
    os.symlink("/dev/zero", "result.json")
elif attack == "result-fifo":
    os.mkfifo("result.json")
elif attack == "result-sparse":
    with open("result.json", "wb") as f:
        f.truncate(600 * 1024 * 1024)
elif attack == "artifact-host-link":
    os.symlink(host, out + "/leak.txt")
elif attack == "artifact-fifo":
    os.mkfifo(out + "/pipe.txt")
elif attack == "artifact-dir-link":
    os.symlink(host, out + "/hostdir")
elif attack == "artifact-sparse":
    with open(out + "/big.bin", "wb") as f:
        f.truncate(600 * 1024 * 1024)
elif attack == "deep-tree":
    # Too deep to recurse into, in both dirs, with links to a host folder at both ends.
    json.dump({"outputs": {}}, open("result.json", "w"))
    for top in (".", out):
        os.symlink(host, top + "/hostdir")
        fd = os.open(top, os.O_RDONLY)
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.symlink(host, "hostdir", dir_fd=fd)
        os.close(fd)
elif attack == "many-entries":
    os.mkdir(out + "/many")
    open(out + "/many/00000", "w").close()
    for i in range(1, 12000):  # links: creating 12000 inodes here takes seconds
        os.link(out + "/many/00000", f"{out}/many/{i:05}")
"""
HOST_SECRET = "HOST-ONLY-7c1f"
MIB = 1024 * 1024


def _leave(api: httpx.Client, tmp_path: Path, attack: str, host: str = "") -> dict[str, Any]:
    deploy_folder(api, make_worker(tmp_path / "leaver", LEAVER_YML, {"run.py": LEAVER_PY}))
    resp = api.post(
        "/api/v1/workers/leaver/runs", json={"inputs": {"attack": attack, "host": host}}
    )
    assert resp.status_code == 202, resp.text
    return wait_for_run(api, resp.json()["id"], timeout=60)


def _root_only_file(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps({"outputs": {"stolen": HOST_SECRET}}))
    secret.chmod(0o600)
    return secret


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _everything_shown(api: httpx.Client, run: dict[str, Any]) -> str:
    return json.dumps(run) + api.get(f"/api/v1/runs/{run['id']}/logs").text


def test_a_result_json_linked_to_a_root_only_host_file_fails_the_run_and_the_file_stays_unread(
    api: httpx.Client, tmp_path: Path
) -> None:
    host_file = _root_only_file(tmp_path)

    run = _leave(api, tmp_path, "result-host-link", str(host_file))

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "result_invalid"
    assert "result.json is a symlink; floom reads only regular files" in run["error"]["message"]
    assert HOST_SECRET not in _everything_shown(api, run)


def test_a_result_json_linked_to_dev_zero_fails_at_once_without_reading_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    before = _peak_rss_mib()

    run = _leave(api, tmp_path, "result-dev-zero")

    assert run["status"] == "failed", run
    assert "result.json is a symlink" in run["error"]["message"]
    assert _peak_rss_mib() - before < 200


def test_a_fifo_named_result_json_fails_the_run_instead_of_holding_its_slot(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "leaver", LEAVER_YML, {"run.py": LEAVER_PY}))
    resp = api.post("/api/v1/workers/leaver/runs", json={"inputs": {"attack": "result-fifo"}})
    run_id = resp.json()["id"]
    fifo = server.ctx.settings.work_root / f"{run_id}-1" / "work" / "result.json"
    try:
        run = wait_for_run(api, run_id, timeout=30)
    finally:
        # Without the fix a reader waits on the FIFO for ever; give it a writer that goes
        # away, so a failing test still ends.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    assert run["status"] == "failed", run
    assert (
        "result.json is a FIFO (named pipe); floom reads only regular files"
        in (run["error"]["message"])
    )
    # The slot is let go right after the end a waiter sees, not at the same instant.
    wait_until(lambda: api.get("/healthz").json()["executor"]["active"] == 0)


def test_a_sparse_600_mb_result_json_is_refused_by_its_size_without_being_read(
    api: httpx.Client, tmp_path: Path
) -> None:
    before = _peak_rss_mib()

    run = _leave(api, tmp_path, "result-sparse")

    assert run["status"] == "failed", run
    message = run["error"]["message"]
    assert f"result.json is {600 * MIB} bytes, over the limit of {MIB}" in message
    assert "FLOOM_MAX_RESULT_BYTES" in message
    assert _peak_rss_mib() - before < 200


def test_an_artifact_linked_to_a_host_file_is_not_kept_and_the_log_says_why(
    api: httpx.Client, tmp_path: Path
) -> None:
    host_file = _root_only_file(tmp_path)

    run = _leave(api, tmp_path, "artifact-host-link", str(host_file))

    assert run["status"] == "succeeded", run
    assert [a["name"] for a in run["artifacts"]] == ["kept.txt"]
    assert "leak.txt is a symlink; floom keeps only regular files" in log_lines(api, run["id"])
    assert HOST_SECRET not in _everything_shown(api, run)


def test_an_artifact_that_is_a_fifo_is_passed_over_with_a_log_line(
    api: httpx.Client, tmp_path: Path
) -> None:
    run = _leave(api, tmp_path, "artifact-fifo")

    assert run["status"] == "succeeded", run
    assert [a["name"] for a in run["artifacts"]] == ["kept.txt"]
    assert "pipe.txt is a FIFO (named pipe); floom keeps only regular files" in log_lines(
        api, run["id"]
    )


def test_a_directory_link_in_the_output_dir_is_not_descended(
    api: httpx.Client, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "inside.txt").write_text(HOST_SECRET)

    run = _leave(api, tmp_path, "artifact-dir-link", str(host_dir))

    assert run["status"] == "succeeded", run
    assert [a["name"] for a in run["artifacts"]] == ["kept.txt"]
    assert "hostdir is a symlink; floom keeps only regular files" in log_lines(api, run["id"])
    assert HOST_SECRET not in _everything_shown(api, run)


def test_a_sparse_huge_artifact_is_refused_by_its_size_and_the_others_are_kept(
    api: httpx.Client, tmp_path: Path
) -> None:
    before = _peak_rss_mib()

    run = _leave(api, tmp_path, "artifact-sparse")

    assert run["status"] == "succeeded", run
    assert [a["name"] for a in run["artifacts"]] == ["kept.txt"]
    lines = log_lines(api, run["id"])
    assert any(
        line.startswith(f"artifact big.bin ({600 * MIB} bytes) was not kept")
        and "FLOOM_MAX_ARTIFACT_BYTES" in line
        for line in lines
    ), lines[-6:]
    assert _peak_rss_mib() - before < 200


def test_a_tree_of_many_entries_is_walked_only_so_far(api: httpx.Client, tmp_path: Path) -> None:
    run = _leave(api, tmp_path, "many-entries")

    assert run["status"] == "succeeded", run
    assert len(run["artifacts"]) <= 1000
    assert "more than 10000 entries; floom stopped looking there" in log_lines(api, run["id"])


def test_a_run_s_dirs_too_deep_to_recurse_into_are_removed_without_following_its_links(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep.txt").write_text(HOST_SECRET)

    work_root = server.ctx.settings.work_root

    def gone(run_id: str) -> bool:
        return not any(p.name.startswith(run_id) for p in work_root.iterdir())

    try:
        run = _leave(api, tmp_path, "deep-tree", str(host))
        again = _leave(api, tmp_path, "artifact-fifo")

        # On a disk of its own the kernel bounds the run (no walk); where the disk is polled,
        # the walk's depth ends it (test_sandbox_limits). Its dirs are removed either way.
        if api.get("/healthz").json()["protections"]["disk_limit"] == "enforced":
            assert run["status"] == "succeeded", run
        else:
            assert run["status"] == "limit_exceeded", run
            assert "folders nested more than 256 deep" in run["error"]["message"]
        assert again["status"] == "succeeded", again
        # Both removed: the deep tree did not end the thread that removes work dirs.
        wait_until(lambda: gone(run["id"]) and gone(again["id"]), timeout=30)
        assert (host / "keep.txt").read_text() == HOST_SECRET
    finally:
        # What a failing run leaves: pytest removes old temporary dirs with shutil.rmtree.
        subprocess.run(["rm", "-rf", "--", str(work_root)], check=False)


GATED_YML = """\
name: gated
inputs: {host: {type: string}}
outputs: {subject: string}
approvals: {required: true}
limits: {timeout_seconds: 15}
"""
GATED_PY = """\
import json, os
if os.environ["FLOOM_PHASE"] == "propose":
    json.dump({"outputs": {"subject": "hi"}}, open("result.json", "w"))
else:
    os.symlink(json.load(open("inputs.json"))["host"], "result.json")
"""


def test_the_apply_phase_never_writes_through_a_result_json_link(
    api: httpx.Client, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text('{"note": "original"}')
    deploy_folder(api, make_worker(tmp_path / "gated", GATED_YML, {"run.py": GATED_PY}))
    run_id = start_run(api, "gated", {"host": str(victim)})
    waiting = wait_status(api, run_id, {"awaiting_approval"})
    (approval,) = waiting["approvals"]
    assert api.post(f"/api/v1/approvals/{approval['id']}/approve", json={}).status_code == 200

    run = wait_status(api, run_id)

    assert victim.read_text() == '{"note": "original"}'
    assert run["status"] == "failed", run
    assert "result.json is a symlink" in run["error"]["message"]


def test_an_agents_file_tools_read_only_regular_files_up_to_their_cap(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url) as rig:
        _agent_reads(rig, tmp_path)


def _agent_reads(rig: AgentRig, tmp_path: Path) -> None:
    rig.deploy(
        agent_worker(
            tmp_path / "reader",
            "name: reader\ntools: [{builtin: run_command}, {builtin: read_file}]\n",
        )
    )
    command = "truncate -s 600M big.bin && mkfifo pipe && ln -s data.txt link && echo made"
    rig.model.script(
        reply(tool_use("run_command", {"command": command})),
        reply(tool_use("read_file", {"path": "big.bin"})),
        reply(tool_use("read_file", {"path": "pipe"})),
        reply(tool_use("read_file", {"path": "link"})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    before = _peak_rss_mib()

    run = wait_status(rig.api, start_run(rig.api, "reader"), timeout=60)

    assert run["status"] == "succeeded", run
    made, big, pipe, link = run["tool_calls"][:4]
    assert made["result"].startswith("exit code 0"), made
    assert big["status"] == "ok", big
    assert (
        big["result"]
        == f"big.bin is a binary file ({600 * 1024 * 1024} bytes); read_file shows text only"
    )
    assert "pipe is a FIFO (named pipe); floom reads only regular files" in pipe["error"]
    assert "link is a symlink; floom reads only regular files" in link["error"]
    assert _peak_rss_mib() - before < 200


def test_a_paused_agents_workspace_keeps_only_regular_files_and_refuses_a_sparse_giant(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url) as rig:
        rig.deploy(
            agent_worker(
                tmp_path / "pauser",
                "name: pauser\ntools: [{builtin: run_command}, {builtin: request_approval}]\n",
            )
        )
        command = "mkfifo pipe && truncate -s 600M big.bin && echo made"
        rig.model.script(
            reply(tool_use("run_command", {"command": command})),
            reply(tool_use("request_approval", {"question": "go on?"})),
        )
        run_id = start_run(rig.api, "pauser")
        wait_status(rig.api, run_id, {"awaiting_approval"}, timeout=60)
        lines = log_lines(rig.api, run_id)

    assert (
        "not kept with the workspace: work/pipe is a FIFO (named pipe); floom keeps only "
        "regular files" in lines
    )
    assert any(
        line.startswith("the workspace (")
        and "bytes of files) is over FLOOM_MAX_BUNDLE_BYTES" in line
        for line in lines
    ), lines[-6:]
