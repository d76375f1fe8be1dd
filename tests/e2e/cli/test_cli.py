"""Acceptance tests of the `floom` command, run as a subprocess against a live server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.cli import serving
from floom.client.rest import FloomClient, FollowEvent
from floom.config import mask_password
from floom.errors import ClientError, NotFound
from floom.schemas.runs import RunDetail, RunUsage
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from tests.support.cli import cli, floom, offline_env
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    free_port,
    make_worker,
    wait_for_run,
    wait_until,
)

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (stdout|stderr|system) (.*)$")

TICKER_YML = """\
name: ticker
inputs:
  count: {type: integer, default: 5}
  pause: {type: number, default: 0.05}
limits: {timeout_seconds: 120}
"""
TICKER_PY = """\
import json, time
from pathlib import Path

inputs = json.loads(Path("inputs.json").read_text())
for i in range(inputs["count"]):
    print(f"tick {i}", flush=True)
    time.sleep(inputs["pause"])
Path("result.json").write_text(json.dumps({"outputs": {}}))
"""
BROKEN_PY = """\
import sys
print("about to fail", file=sys.stderr, flush=True)
sys.exit(3)
"""


def start(api: httpx.Client, worker: str, **inputs: Any) -> str:
    resp = api.post(f"/api/v1/workers/{worker}/runs", json={"inputs": inputs})
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def log_lines(stdout: str) -> list[tuple[str, str]]:
    found = []
    for line in stdout.splitlines():
        match = LOG_LINE.match(line.rstrip())
        if match:
            found.append((match.group(1), match.group(2)))
    return found


def broken_folder(tmp_path: Path) -> Path:
    manifest = (
        "name: Bad Name\ninputs:\n  count:\n    type: integr\nlimits:\n  timeout_seconds: -5\n"
    )
    return make_worker(tmp_path / "broken", manifest, {"run.py": "print(1)\n"})


# -- local commands --------------------------------------------------------------------------


def test_validate_accepts_a_good_folder_without_a_server(tmp_path: Path) -> None:
    result = floom("validate", str(EXAMPLES / "hello"), env=offline_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok: hello (script, entry run.py)"


def test_validate_lists_every_problem_with_its_path_and_hint(tmp_path: Path) -> None:
    result = floom("validate", str(broken_folder(tmp_path)), env=offline_env(tmp_path))
    assert result.returncode == 1
    assert "3 problems" in result.stderr
    for path in ("name:", "inputs.count.type:", "limits.timeout_seconds:"):
        assert f"  {path}" in result.stderr
    assert "did you mean 'integer'" in result.stderr


def test_mask_password_hides_only_the_password() -> None:
    url = "postgresql+psycopg://floom:s3cret@db.local:5432/floom"
    assert mask_password(url) == "postgresql+psycopg://floom:***@db.local:5432/floom"
    assert mask_password("sqlite:////tmp/floom.db") == "sqlite:////tmp/floom.db"


def test_unreachable_server_gives_a_clear_error_and_hint(tmp_path: Path) -> None:
    env = offline_env(tmp_path)
    result = floom("workers", env=env)
    assert result.returncode == 1
    assert f"error: cannot reach floom at {env['FLOOM_BASE_URL']}" in result.stderr
    assert "hint: start it with `floom serve` or set FLOOM_BASE_URL" in result.stderr


def test_serve_flags_override_the_environment(tmp_path: Path) -> None:
    port = free_port()
    env = offline_env(tmp_path)
    env.update(FLOOM_PORT="1", FLOOM_DEPLOY_EXAMPLES="false", FLOOM_SECRET_KEY="test-secret-key")
    proc = subprocess.Popen(
        [sys.executable, "-m", "floom.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, "floom serve exited early"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=30, interval=0.1)
        key_file = tmp_path / "home" / "admin.key"
        assert key_file.stat().st_mode & 0o777 == 0o600
    finally:
        proc.terminate()
        stdout, _ = proc.communicate(timeout=30)
    first = stdout.splitlines()[0]
    assert f"http://127.0.0.1:{port}" in first
    assert str(tmp_path / "home") in first
    assert "sqlite:///" in first


def test_serve_reads_its_own_options_without_typer_and_hands_anything_else_to_typer() -> None:
    assert serving.parse([]) == {}
    assert serving.parse(
        ["--host", "0.0.0.0", "--port=8080", "--roles", "api", "--database-url=sqlite:///x.db"]
    ) == {"host": "0.0.0.0", "port": 8080, "roles": "api", "database_url": "sqlite:///x.db"}
    assert serving.parse(["--sandbox", "e2b", "--sandbox", "local"]) == {"sandbox": "local"}
    for typer_reads in (
        ["--help"],
        ["--port", "eighty"],
        ["--port"],
        ["--role", "api"],
        ["extra"],
        ["--", "--port", "1"],
    ):
        assert serving.parse(typer_reads) is None, typer_reads


# -- workers and versions --------------------------------------------------------------------


def test_deploy_of_a_broken_folder_sends_nothing(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    result = cli(server, "deploy", str(broken_folder(tmp_path)))
    assert result.returncode == 1
    assert "inputs.count.type:" in result.stderr
    assert api.get("/api/v1/workers").json()["items"] == []


def test_deploying_the_same_folder_twice_keeps_the_version(
    server: LiveServer, api: httpx.Client
) -> None:
    first = cli(server, "deploy", str(EXAMPLES / "hello"))
    second = cli(server, "deploy", str(EXAMPLES / "hello"))
    assert first.returncode == 0, first.stderr + second.stderr
    assert second.returncode == 0, first.stderr + second.stderr
    version = api.get("/api/v1/workers/hello").json()["active_version_id"]
    assert f"hello version {version}" in first.stdout
    assert "unchanged" not in first.stdout
    assert f"hello version {version} unchanged" in second.stdout
    assert len(api.get("/api/v1/workers/hello/versions").json()["items"]) == 1
    listing = cli(server, "workers")
    assert re.search(rf"^hello\s+script\s+{version}", listing.stdout, re.M), listing.stdout


def test_versions_and_rollback_to_an_earlier_version(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "ticker", TICKER_YML, {"run.py": TICKER_PY})
    v1 = deploy_folder(api, folder)["version"]["id"]
    (folder / "notes.txt").write_text("second version\n")
    v2 = deploy_folder(api, folder)["version"]["id"]
    assert v1 != v2

    listing = cli(server, "versions", "ticker")
    assert listing.returncode == 0, listing.stderr
    assert re.search(rf"^\*\s+{v2}", listing.stdout, re.M), listing.stdout
    assert re.search(rf"^\s+{v1}", listing.stdout, re.M), listing.stdout

    result = cli(server, "rollback", "ticker", "--to", v1)
    assert result.returncode == 0, result.stderr
    assert v1 in result.stdout
    assert api.get("/api/v1/workers/ticker").json()["active_version_id"] == v1

    neither = cli(server, "rollback", "ticker")
    assert neither.returncode == 2
    assert "--to" in neither.stderr


# -- runs ------------------------------------------------------------------------------------


def test_run_wait_follows_the_log_and_prints_the_outputs(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    result = cli(server, "run", "hello", "-i", "name=Ada", "--wait")
    assert result.returncode == 0, result.stderr
    assert ("stdout", "Hello, Ada!") in log_lines(result.stdout)
    assert "greeting: Hello, Ada!" in result.stdout
    assert "greeting.txt" in result.stdout
    assert re.search(r"run run_\w+ succeeded", result.stdout)


def test_run_json_prints_only_the_final_run_record(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    result = cli(
        server, "run", "hello", "--input-json", '{"name": "Bo", "times": 2}', "--wait", "--json"
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["status"] == "succeeded"
    assert record["inputs"] == {"name": "Bo", "times": 2}
    assert record["outputs"]["greeting"] == "Hello, Bo! Hello, Bo!"
    assert [a["name"] for a in record["artifacts"]] == ["greeting.txt"]


def test_run_without_wait_prints_the_run_id(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    result = cli(server, "run", "hello", "-i", "times=3")
    assert result.returncode == 0, result.stderr
    run = wait_for_run(api, result.stdout.strip())
    assert run["inputs"] == {"name": "world", "times": 3}


def test_a_bad_input_names_the_field_and_creates_no_run(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    result = cli(server, "run", "hello", "-i", "times=abc", "--wait")
    assert result.returncode == 1
    assert "error:" in result.stderr
    assert "times" in result.stderr
    assert "hint:" in result.stderr
    assert api.get("/api/v1/runs", params={"worker": "hello"}).json()["items"] == []


def test_an_input_without_equals_is_a_usage_error(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    result = cli(server, "run", "hello", "-i", "name")
    assert result.returncode == 2
    assert "KEY=VALUE" in result.stderr
    assert api.get("/api/v1/runs").json()["items"] == []


def test_a_failed_run_exits_1_and_runs_filters_by_status(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    deploy_folder(api, make_worker(tmp_path / "broken", "name: broken\n", {"run.py": BROKEN_PY}))
    good = start(api, "hello")
    wait_for_run(api, good)

    failed = cli(server, "run", "broken", "--wait")
    assert failed.returncode == 1
    assert ("stderr", "about to fail") in log_lines(failed.stdout)
    bad = re.search(r"run (run_\w+) failed", failed.stdout)
    assert bad, failed.stdout

    listing = cli(server, "runs", "--status", "failed")
    assert listing.returncode == 0, listing.stderr
    assert bad.group(1) in listing.stdout
    assert good not in listing.stdout
    as_json = json.loads(cli(server, "runs", "--status", "failed", "--json").stdout)
    assert [r["id"] for r in as_json["items"]] == [bad.group(1)]


def test_runs_prints_the_next_cursor(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    ids = [start(api, "hello", times=n) for n in (1, 2, 3)]
    first = cli(server, "runs", "--limit", "2")
    cursor = re.search(r"floom runs --cursor (\S+)", first.stdout)
    assert cursor, first.stdout
    second = cli(server, "runs", "--limit", "2", "--cursor", cursor.group(1))
    assert ids[0] in second.stdout
    assert ids[0] not in first.stdout
    assert ids[2] in first.stdout


def test_logs_prints_ordered_timestamped_lines(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "ticker", TICKER_YML, {"run.py": TICKER_PY}))
    run_id = start(api, "ticker", count=5)
    wait_for_run(api, run_id)

    result = cli(server, "logs", run_id)
    assert result.returncode == 0, result.stderr
    lines = log_lines(result.stdout)
    assert [line for stream, line in lines if stream == "stdout"] == [f"tick {i}" for i in range(5)]
    assert lines[0][0] == "system"

    events = [json.loads(x) for x in cli(server, "logs", run_id, "--json").stdout.splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs) == len(lines)

    tail = log_lines(cli(server, "logs", run_id, "--tail", "2").stdout)
    assert tail == lines[-2:]


def test_logs_follow_streams_a_live_run_until_it_ends(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "ticker", TICKER_YML, {"run.py": TICKER_PY}))
    run_id = start(api, "ticker", count=20, pause=0.1)
    result = cli(server, "logs", run_id, "-f")
    assert result.returncode == 0, result.stderr
    ticks = [line for stream, line in log_lines(result.stdout) if stream == "stdout"]
    assert ticks == [f"tick {i}" for i in range(20)]
    assert f"run {run_id} succeeded" in result.stdout


def test_wait_timeout_and_cancel(server: LiveServer, api: httpx.Client, tmp_path: Path) -> None:
    deploy_folder(api, make_worker(tmp_path / "ticker", TICKER_YML, {"run.py": TICKER_PY}))
    result = cli(server, "run", "ticker", "-i", "count=1000", "-i", "pause=0.1", "--timeout", "1")
    assert result.returncode == 1
    assert "at the deadline" in result.stderr
    assert "floom logs -f" in result.stderr
    run_id = api.get("/api/v1/runs", params={"worker": "ticker"}).json()["items"][0]["id"]

    cancelled = cli(server, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_for_run(api, run_id)["status"] == "cancelled"
    again = cli(server, "cancel", run_id)
    assert again.returncode == 1
    assert "already ended" in again.stderr


def test_show_replay_and_artifacts(server: LiveServer, api: httpx.Client, tmp_path: Path) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    original = start(api, "hello", name="Cy")
    wait_for_run(api, original)

    shown = cli(server, "show", original)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^status\s+succeeded", shown.stdout, re.M)
    assert "greeting: Hello, Cy!" in shown.stdout
    assert json.loads(cli(server, "show", original, "--json").stdout)["id"] == original

    replayed = cli(server, "replay", original)
    assert replayed.returncode == 0, replayed.stderr
    again = wait_for_run(api, replayed.stdout.strip())
    assert again["replay_of"] == original
    assert again["inputs"] == {"name": "Cy", "times": 1}

    listing = cli(server, "artifacts", original)
    assert re.search(r"^greeting\.txt\s+\d+ B\s+text/plain", listing.stdout, re.M), listing.stdout
    target = tmp_path / "out.txt"
    saved = cli(server, "artifacts", original, "--download", "greeting.txt", "-o", str(target))
    assert saved.returncode == 0, saved.stderr
    assert target.read_text() == "Hello, Cy!\n"


def test_showing_an_unknown_run_is_a_clear_error(server: LiveServer) -> None:
    result = cli(server, "show", "run_nope")
    assert result.returncode == 1
    assert "error: no run run_nope" in result.stderr
    assert "hint:" in result.stderr


# -- secrets and keys ------------------------------------------------------------------------


def test_secrets_set_from_stdin_are_listed_by_name_only(server: LiveServer) -> None:
    value = "s3cret-value-4711"
    result = cli(server, "secrets", "set", "MY_TOKEN", stdin=value + "\n")
    assert result.returncode == 0, result.stderr
    assert value not in result.stdout + result.stderr
    stored, missing = secrets.resolve(server.ctx, ["MY_TOKEN"])
    assert stored == {"MY_TOKEN": value}
    assert missing == []

    listing = cli(server, "secrets", "list")
    assert "MY_TOKEN" in listing.stdout
    assert value not in listing.stdout + listing.stderr

    removed = cli(server, "secrets", "rm", "MY_TOKEN")
    assert removed.returncode == 0, removed.stderr
    assert "MY_TOKEN" not in cli(server, "secrets", "list").stdout


def test_secrets_set_refuses_an_empty_value(server: LiveServer) -> None:
    result = cli(server, "secrets", "set", "EMPTY", "--value-stdin", stdin="")
    assert result.returncode == 1
    assert "empty" in result.stderr
    assert secrets.list_secrets(server.ctx, caller=SYSTEM) == []


def test_keys_create_list_and_revoke(server: LiveServer, api: httpx.Client) -> None:
    created = cli(server, "keys", "create", "--scope", "read", "--scope", "run", "--name", "ci")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert "\n" not in key
    assert key
    assert "not be shown again" in created.stderr
    assert cli(server, "workers", key=key).returncode == 0

    listing = cli(server, "keys", "list")
    assert re.search(r"\bci\b.*\bread,run\b", listing.stdout), listing.stdout
    assert key not in listing.stdout
    key_id = next(k["id"] for k in api.get("/api/v1/keys").json()["items"] if k["name"] == "ci")

    assert cli(server, "keys", "revoke", key_id).returncode == 0
    refused = cli(server, "workers", key=key)
    assert refused.returncode == 1
    assert "error: the API key is not valid or was revoked" in refused.stderr
    assert "hint:" in refused.stderr


def test_a_key_without_the_scope_is_refused(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    key = cli(server, "keys", "create", "--scope", "read").stdout.strip()
    result = cli(server, "run", "hello", key=key)
    assert result.returncode == 1
    assert "'run' scope" in result.stderr
    assert api.get("/api/v1/runs").json()["items"] == []


def test_no_api_key_at_all_gives_a_clear_error(server: LiveServer) -> None:
    result = cli(server, "workers", key="")
    assert result.returncode == 1
    assert "error: no API key configured" in result.stderr
    assert "hint: set FLOOM_API_KEY" in result.stderr


def test_the_admin_key_file_is_used_when_no_key_is_set(server: LiveServer) -> None:
    env = server.cli_env(key="")
    home = Path(env["FLOOM_DATA_DIR"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "admin.key").write_text(server.admin_key + "\n")
    result = floom("workers", env=env)
    assert result.returncode == 0, result.stderr


def test_following_a_finished_run_prints_each_line_once(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run_id = start(api, "hello")
    wait_for_run(api, run_id)
    result = cli(server, "logs", run_id, "-f", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x)["line"] for x in result.stdout.splitlines()]
    assert "Hello, world!" in lines
    assert len(lines) == len(set(lines))


# -- following, in memory --------------------------------------------------------------------


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return "".join(
        f"id: {data.get('seq', '')}\nevent: {kind}\ndata: {json.dumps(data)}\n\n: keep-alive\n\n"
        for kind, data in events
    ).encode()


def log_event(seq: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "ts": "2026-01-01T00:00:00+00:00",
        "stream": "stdout",
        "line": f"l{seq}",
        "attempt": 1,
    }


def run_body(run_id: str, status: str) -> dict[str, Any]:
    """A whole run record, as GET /api/v1/runs/{id} answers it."""
    return RunDetail(
        id=run_id,
        worker="w",
        version_id="ver_1",
        status=status,
        trigger="api",
        inputs={},
        outputs=None,
        error=None,
        exit_code=None,
        attempt=1,
        max_attempts=1,
        replay_of=None,
        retry_of=None,
        parent_run_id=None,
        phase=None,
        scheduled_for=None,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        started_at=None,
        finished_at=None,
        cancel_requested=False,
        usage=RunUsage(sandbox_seconds=0.0),
        tool_calls=[],
        approvals=[],
        model_usage=None,
    ).to_json()


def test_follow_resumes_from_the_last_seq_when_the_stream_breaks() -> None:
    asked: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params.get("after"))
        headers = {"content-type": "text/event-stream"}
        if len(asked) == 1:  # the first connection drops after two lines
            return httpx.Response(
                200, headers=headers, content=sse(("log", log_event(1)), ("log", log_event(2)))
            )
        end = {"id": "run_1", "status": "succeeded"}
        return httpx.Response(
            200, headers=headers, content=sse(("log", log_event(3)), ("end", end))
        )

    client = FloomClient("http://floom.test", "key", transport=httpx.MockTransport(handler))
    events = list(client.follow("run_1"))
    assert [e.data.get("seq") for e in events if e.kind == "log"] == [1, 2, 3]
    assert events[-1].kind == "end"
    assert events[-1].data["status"] == "succeeded"
    assert asked == ["0", "2"]


def test_follow_polls_the_logs_when_streaming_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/logs/stream"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no route"}})
        if path.endswith("/logs"):
            after = int(request.url.params["after"])
            items = [log_event(after + 1)] if after < 3 else []
            last = after + len(items)
            body = {
                "items": items,
                "last_seq": last,
                "run_status": "running",
                "complete": last >= 3,
            }
            return httpx.Response(200, json=body)
        return httpx.Response(200, json=run_body("run_1", "failed"))

    client = FloomClient("http://floom.test", "key", transport=httpx.MockTransport(handler))
    events = list(client.follow("run_1"))
    assert [e.data.get("seq") for e in events if e.kind == "log"] == [1, 2, 3]
    assert events[-1] == FollowEvent("end", run_body("run_1", "failed"))


def test_api_errors_carry_floom_code_and_hint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        error = {"code": "not_found", "message": "no worker nope", "hint": "`floom workers`"}
        return httpx.Response(404, json={"error": error})

    client = FloomClient("http://floom.test", "key", transport=httpx.MockTransport(handler))
    with pytest.raises(NotFound) as caught:  # the server's own class, rebuilt from its code
        client.get_worker("nope")
    exc = caught.value
    assert (exc.status, exc.code, exc.message, exc.hint) == (
        404,
        "not_found",
        "no worker nope",
        "`floom workers`",
    )


def test_a_code_the_client_does_not_know_still_carries_status_code_and_hint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        error = {"code": "from_the_future", "message": "new refusal", "hint": "upgrade"}
        return httpx.Response(418, json={"error": error})

    client = FloomClient("http://floom.test", "key", transport=httpx.MockTransport(handler))
    with pytest.raises(ClientError) as caught:
        client.get_worker("nope")
    assert (caught.value.status, caught.value.code, caught.value.hint) == (
        418,
        "from_the_future",
        "upgrade",
    )
