"""The E2B backend against the wire-level stand-in (tests/standins/e2b): what the contract
suite cannot say for every backend. Requests per run, what reaches the sandbox and what does
not, hostile files coming back, and E2B's own failures."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from e2b import Sandbox as E2BBox

from floom.agent.runner import run_agent
from floom.engine.executor import Executor
from floom.sandbox.base import SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.e2b import backend as backend_module
from floom.sandbox.e2b.backend import E2BSandbox
from floom.sandbox.fake import FakeSandbox
from floom.services.context import Context
from tests.standins.e2b import E2BStandin
from tests.support.rigs.e2b import e2b_backend
from tests.support.rigs.sandboxes import run_script

# A run is: create, upload, command (unpacking first), pack, download, kill.
REQUESTS_PER_RUN = 6


def test_a_run_takes_the_same_few_requests_however_many_files_the_bundle_holds(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    (tmp_path / "small").mkdir()
    small, _ = run_script(e2b, tmp_path / "small", "print('one file')")
    counted = sum(standin.requests.values())
    standin.reset_counts()
    bundle = tmp_path / "large" / "work"
    bundle.mkdir(parents=True)
    for i in range(300):
        (bundle / f"data_{i:03}.txt").write_text(f"row {i}\n" * 100)
    large, lines = run_script(
        e2b,
        tmp_path / "large",
        "import glob\nprint(len(glob.glob('data_*.txt')))",
    )
    assert (small.exit_code, large.exit_code) == (0, 0)
    assert lines == [("stdout", "300")]
    assert counted == sum(standin.requests.values()) == REQUESTS_PER_RUN, standin.requests
    assert standin.requests["POST /files"] == 1


def test_the_sandbox_gets_the_runs_metadata_and_environment_never_floom_s_key(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    def look(stream: str, line: str) -> None:
        (box,) = standin.sandboxes.values()
        seen.update(metadata=box.metadata, env_vars=box.env_vars, internet=box.allow_internet)

    result, lines = run_script(
        e2b,
        tmp_path,
        "import json, os\nprint(json.dumps(dict(os.environ)))",
        on_line=look,
        env={"DECLARED": "s3cret-value", "FLOOM_RUN_ID": "run_meta"},
        metadata={"floom_run_id": "run_meta", "floom_node": "node-a"},
    )
    assert result.exit_code == 0
    env = json.loads(lines[0][1])
    assert env["DECLARED"] == "s3cret-value"
    assert env["FLOOM_OUTPUT_DIR"].endswith("/output")
    assert standin.api_key not in json.dumps(env)
    assert seen["metadata"] == {"floom_run_id": "run_meta", "floom_node": "node-a"}
    # Secrets travel with the command, not as the sandbox's stored env vars.
    assert "s3cret-value" not in json.dumps(seen["env_vars"])
    assert seen["internet"] is False
    assert standin.killed  # killed once the run ended


def test_internet_access_only_with_network_full(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    seen: list[bool] = []

    def look(stream: str, line: str) -> None:
        seen.extend(box.allow_internet for box in standin.sandboxes.values())

    result, _ = run_script(e2b, tmp_path, "print('x')", on_line=look, network=True)
    assert result.exit_code == 0
    assert seen == [True]


def test_links_and_files_outside_the_workspace_do_not_come_back(
    e2b: E2BSandbox, tmp_path: Path
) -> None:
    result, lines = run_script(
        e2b,
        tmp_path,
        """
        import json, os
        out = os.environ['FLOOM_OUTPUT_DIR']
        os.symlink('/etc/passwd', os.path.join(out, 'passwd'))
        os.symlink('/etc', 'result.json')
        open(os.path.join(out, 'kept.txt'), 'w').write('kept')
        """,
    )
    assert result.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "output").iterdir()) == ["kept.txt"]
    assert not (tmp_path / "work" / "result.json").exists()
    assert any("not a regular file" in line for _, line in lines)


def test_files_over_what_floom_brings_back_end_the_run_as_a_limit(
    standin: E2BStandin, tmp_path: Path
) -> None:
    e2b = e2b_backend(standin, max_artifact_bytes=20_000, max_result_bytes=1_000)
    result, _ = run_script(
        e2b,
        tmp_path,
        "import os\nopen(os.path.join(os.environ['FLOOM_OUTPUT_DIR'], 'big'), 'wb')"
        ".write(os.urandom(3_000_000))",
    )
    assert result.limit_exceeded == "files"
    assert "FLOOM_MAX_ARTIFACT_BYTES" in (result.error or "")
    assert list((tmp_path / "output").iterdir()) == []
    assert not standin.sandboxes


def test_a_missing_template_is_refused_naming_it_and_not_retried(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        run_script(e2b, tmp_path, "print(1)", template="no-such-template")
    assert "no-such-template" in refused.value.message
    assert refused.value.retryable is False


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("unauthorized", "API key"),
        ("quota", "concurrent sandboxes"),
        ("server_error", "E2B failed"),
    ],
)
def test_e2b_failures_are_sandbox_unavailable_saying_what_to_check(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path, fault: str, says: str
) -> None:
    standin.fail_control_plane(fault)
    with pytest.raises(SandboxUnavailable) as failed:
        run_script(e2b, tmp_path, "print(1)")
    assert says in failed.value.message
    assert failed.value.hint
    assert standin.api_key not in f"{failed.value.message} {failed.value.hint}"


def test_a_sandbox_killed_from_outside_ends_the_run_as_sandbox_unavailable(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    def kill_it(stream: str, line: str) -> None:
        for sandbox_id in list(standin.sandboxes):
            standin.kill_sandbox(sandbox_id)

    with pytest.raises(SandboxUnavailable) as gone:
        run_script(
            e2b,
            tmp_path,
            "import time\nprint('started', flush=True)\ntime.sleep(60)",
            on_line=kill_it,
        )
    assert "ended or became unreachable" in gone.value.message


def test_e2b_down_mid_run_ends_the_run_as_sandbox_unavailable_not_a_hang(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    went_down = threading.Event()

    def take_down(stream: str, line: str) -> None:
        if not went_down.is_set():
            went_down.set()
            standin.down()

    try:
        with pytest.raises(SandboxUnavailable):
            run_script(
                e2b,
                tmp_path,
                "import time\nprint('started', flush=True)\ntime.sleep(60)",
                on_line=take_down,
                timeout_seconds=20.0,
                metadata={"floom_run_id": "run_down", "floom_node": "node-down"},
            )
    finally:
        standin.up()
    # The sandbox floom could not kill while E2B was down is an orphan, reaped once it is back.
    assert e2b.reap_orphans(node_id="node-down", work_root=tmp_path, live_run_ids=set) == 1
    assert not standin.sandboxes


def test_orphans_are_the_sandboxes_naming_this_node_whose_run_is_not_live(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path
) -> None:
    started = threading.Event()
    results: list[SandboxResult | Exception] = []
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    spec = SandboxSpec(
        run_id="run_orphan",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        metadata={"floom_run_id": "run_orphan", "floom_node": "node-a"},
    )

    def target() -> None:
        try:
            results.append(
                e2b.run(spec, on_line=lambda *line: started.set(), should_cancel=lambda: False)
            )
        except SandboxUnavailable as exc:
            results.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    assert started.wait(20)
    assert e2b.reap_orphans(node_id="node-b", work_root=tmp_path, live_run_ids=set) == 0
    assert (
        e2b.reap_orphans(node_id="node-a", work_root=tmp_path, live_run_ids=lambda: {"run_orphan"})
        == 0
    )
    assert e2b.reap_orphans(node_id="node-a", work_root=tmp_path, live_run_ids=set) == 1
    thread.join(20)
    assert isinstance(results[0], SandboxUnavailable)
    assert not standin.sandboxes


def test_a_node_starting_after_kill_9_kills_the_e2b_sandboxes_it_left(
    ctx: Context, standin: E2BStandin
) -> None:
    # What a node killed with kill -9 mid-run leaves: a sandbox naming it, of a run it no
    # longer runs; and one of another node, which is not its to kill.
    mine = E2BBox.create(metadata={"floom_node": ctx.node_id, "floom_run_id": "run_lost"})
    theirs = E2BBox.create(metadata={"floom_node": "another-node", "floom_run_id": "run_x"})
    ctx.settings.e2b_api_key = standin.api_key
    executor = Executor(ctx, FakeSandbox(), run_agent=run_agent)
    executor.start()
    try:
        assert mine.sandbox_id in standin.killed
        assert theirs.sandbox_id in standin.sandboxes
    finally:
        executor.stop(grace_seconds=1)
        theirs.kill()


def test_files_that_cannot_be_unpacked_are_sandbox_unavailable_a_script_s_own_exit_is_not(
    e2b: E2BSandbox, standin: E2BStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command unpacks the uploaded archive before it runs; exit 198 with the archive
    # still there is the unpack failing, never the script.
    (tmp_path / "own").mkdir()
    own, _ = run_script(e2b, tmp_path / "own", "raise SystemExit(198)")
    assert own.exit_code == 198

    def corrupt(trees: dict[str, Path], *, since: object = None) -> tuple[bytes, dict[str, object]]:
        return b"not a gzip archive", {}

    monkeypatch.setattr(backend_module, "pack", corrupt)
    (tmp_path / "corrupt").mkdir()
    with pytest.raises(SandboxUnavailable, match="could not be unpacked"):
        run_script(e2b, tmp_path / "corrupt", "print('never')")
