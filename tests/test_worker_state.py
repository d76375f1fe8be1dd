"""Worker state with real parts: a script in the bubblewrap sandbox reads state.json and leaves
a new state in result.json, committed only with the run's success; concurrent runs on
PostgreSQL end one committed, one `state_conflict`; an oversized or non-JSON state is refused
naming the field and changes nothing; an operator reads, sets and restores it over REST; a
replay starts from its original's state. On SQLite and PostgreSQL unless said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from floom.errors import ManifestInvalid
from floom.manifest.load import parse_manifest
from floom.manifest.schema import manifest_json_schema
from floom.services.workers.limit_ceilings import over_ceilings
from tests.agent_helpers import agent_rig, agent_worker, start_run, wait_status
from tests.conftest import (
    LiveServer,
    deploy_folder,
    fast_settings,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.mcp_support import call, call_error, http_client, stdio_client
from tests.standins.anthropic_api import reply, tool_use
from tests.test_cli import cli
from tests.web_support import csrf_of, signed_in_client

COUNTER_YML = """\
name: counter
state: true
inputs:
  fail: {type: boolean, default: false}
  big: {type: integer, default: 0}
outputs:
  seen: {type: object}
"""

# Counts its successful runs in its state; `fail` leaves a new state and then fails, `big`
# leaves a state of that many characters.
COUNTER_PY = """\
import json, os
inputs = json.load(open("inputs.json"))
seen = json.load(open("state.json"))
state = {"count": (seen or {}).get("count", 0) + 1, "run": os.environ["FLOOM_RUN_ID"]}
if inputs["big"]:
    state["pad"] = "x" * inputs["big"]
result = {"outputs": {"seen": {"state": seen}}, "state": state}
if inputs["fail"]:
    result["error"] = "failing on purpose"
    result["retryable"] = False
json.dump(result, open("result.json", "w"))
"""


def _deploy(api: httpx.Client, tmp_path: Path, manifest: str = COUNTER_YML, py: str = COUNTER_PY):
    deploy_folder(api, make_worker(tmp_path / "counter", manifest, {"run.py": py}))


def _run(api: httpx.Client, **inputs: Any) -> dict[str, Any]:
    return wait_for_run(api, start_run(api, "counter", inputs))


def _state(api: httpx.Client) -> dict[str, Any]:
    resp = api.get("/api/v1/workers/counter/state")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_a_script_reads_the_state_its_last_success_left_and_leaves_the_next(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    assert _state(api)["current_version"] == 0 and _state(api)["state"] is None

    first = _run(api)
    second = _run(api)

    assert first["status"] == "succeeded", first
    assert first["outputs"]["seen"] == {"state": None}
    assert second["outputs"]["seen"] == {"state": {"count": 1, "run": first["id"]}}
    state = _state(api)
    assert state["enabled"] is True and state["current_version"] == 2
    assert state["state"] == {"count": 2, "run": second["id"]}
    assert state["written"]["written_by"] == f"run:{second['id']}"
    assert state["written"]["run_id"] == second["id"] and state["written"]["source"] == "run"
    versions = api.get("/api/v1/workers/counter/state/versions").json()["items"]
    assert [(v["version"], v["run_id"]) for v in versions] == [(2, second["id"]), (1, first["id"])]
    older = api.get("/api/v1/workers/counter/state", params={"version": 1}).json()
    assert older["state"] == {"count": 1, "run": first["id"]} and older["current_version"] == 2


def test_a_failed_run_changes_no_state_even_when_it_left_one(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    ok = _run(api)

    failed = _run(api, fail=True)

    assert failed["status"] == "failed" and failed["error"]["code"] == "worker_error"
    state = _state(api)
    assert state["current_version"] == 1 and state["state"]["run"] == ok["id"]
    assert len(api.get("/api/v1/workers/counter/state/versions").json()["items"]) == 1


def test_an_oversized_state_fails_the_run_naming_the_field_and_changes_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 200}"))
    _run(api)

    run = _run(api, big=500)

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "state_too_large"
    assert "state is" in run["error"]["message"] and "at most 200" in run["error"]["message"]
    assert _state(api)["current_version"] == 1


def test_a_worker_without_state_gets_no_state_json_and_its_state_is_ignored(
    api: httpx.Client, tmp_path: Path
) -> None:
    py = COUNTER_PY.replace('json.load(open("state.json"))', 'os.path.exists("state.json")')
    _deploy(api, tmp_path, COUNTER_YML.replace("state: true\n", ""), py)

    run = _run(api)

    assert run["status"] == "succeeded" and run["outputs"]["seen"] == {"state": False}
    assert _state(api)["current_version"] == 0 and _state(api)["enabled"] is False


def test_an_operator_sets_restores_and_compares_and_sets_the_state_over_rest(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    put = api.put("/api/v1/workers/counter/state", json={"state": {"count": 41}})
    assert put.status_code == 200, put.text
    assert put.json()["written"]["source"] == "operator" and put.json()["version"] == 1

    run = _run(api)
    assert run["outputs"]["seen"] == {"state": {"count": 41}}
    assert _state(api)["state"]["count"] == 42

    stale = api.put("/api/v1/workers/counter/state", json={"state": {}, "if_version": 1})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "state_conflict"
    restored = api.put("/api/v1/workers/counter/state", json={"from_version": 1})
    assert restored.status_code == 200, restored.text
    body = restored.json()
    assert body["version"] == 3 and body["state"] == {"count": 41}
    assert body["written"]["source"] == "restore" and body["written"]["restored_from"] == 1


def test_bad_state_from_an_operator_is_refused_clearly_and_changes_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 100}"))
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 1}})

    too_large = api.put("/api/v1/workers/counter/state", json={"state": {"pad": "x" * 200}})
    not_json = api.put(
        "/api/v1/workers/counter/state",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    both = api.put("/api/v1/workers/counter/state", json={"state": 1, "from_version": 1})
    missing = api.put("/api/v1/workers/counter/state", json={"from_version": 9})
    deep = api.put("/api/v1/workers/counter/state", json={"state": json.loads("[" * 70 + "]" * 70)})

    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "state_too_large"
    assert too_large.json()["error"]["details"][0]["path"] == "state"
    assert "FLOOM_MAX_STATE_BYTES" in too_large.json()["error"]["hint"]
    assert not_json.status_code == 422
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    assert missing.status_code == 404
    assert deep.status_code == 422 and deep.json()["error"]["code"] == "state_invalid"
    state = _state(api)
    assert state["current_version"] == 1 and state["state"] == {"count": 1}


def test_a_replay_starts_from_its_originals_state_and_never_overwrites_a_newer_one(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    first = _run(api)
    second = _run(api)

    replay = api.post(f"/api/v1/runs/{second['id']}/replay", json={})
    assert replay.status_code in (200, 201, 202), replay.text
    replayed = wait_for_run(api, replay.json()["id"])

    # The state second started from (version 1, written by first), not the current one.
    assert replayed["outputs"]["seen"] == {"state": {"count": 1, "run": first["id"]}}
    assert replayed["status"] == "failed" and replayed["error"]["code"] == "state_conflict"
    assert _state(api)["state"]["run"] == second["id"]


def _ready(server: LiveServer, run_id: str, attempt: int) -> Path | None:
    """The output dir of the attempt once its script said it read its state (a run started
    ahead of its queueing has dirs of its own, named so)."""
    for base in server.ctx.settings.work_root.glob(f"{run_id}-{attempt}*"):
        if (base / "output" / "ready").exists():
            return base / "output"
    return None


RACER_PY = """\
import json, os, time
out = os.environ["FLOOM_OUTPUT_DIR"]
seen = json.load(open("state.json"))
open(os.path.join(out, "ready"), "w").close()
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.02)
json.dump({"outputs": {"seen": {"state": seen}}, "state": {"by": os.environ["FLOOM_RUN_ID"]}},
          open("result.json", "w"))
"""


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_two_runs_from_one_state_on_postgres_end_one_written_one_state_conflict(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, COUNTER_YML, RACER_PY)
    runs = [start_run(api, "counter"), start_run(api, "counter")]

    # Both have read state.json (version 0) before either may finish.
    outputs = [wait_until(lambda r=r: _ready(server, r, 1), timeout=30) for r in runs]
    for output in outputs:
        (output / "go").touch()
    ended = [wait_for_run(api, run_id) for run_id in runs]

    statuses = sorted((r["status"], (r["error"] or {}).get("code")) for r in ended)
    assert statuses == [("failed", "state_conflict"), ("succeeded", None)], ended
    (winner,) = [r for r in ended if r["status"] == "succeeded"]
    state = _state(api)
    assert state["current_version"] == 1 and state["state"] == {"by": winner["id"]}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_with_on_conflict_retry_the_losing_run_runs_again_from_the_winners_state(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    manifest = COUNTER_YML.replace("state: true", "state: {on_conflict: retry}")
    _deploy(api, tmp_path, manifest, RACER_PY)
    runs = [start_run(api, "counter"), start_run(api, "counter")]
    outputs = [wait_until(lambda r=r: _ready(server, r, 1), timeout=30) for r in runs]
    for output in outputs:
        (output / "go").touch()

    again = wait_until(lambda: _ready(server, runs[0], 2) or _ready(server, runs[1], 2))
    (again / "go").touch()
    ended = [wait_for_run(api, run_id) for run_id in runs]

    assert [r["status"] for r in ended] == ["succeeded", "succeeded"], ended
    (retried,) = [r for r in ended if r["attempt"] == 2]
    (first,) = [r for r in ended if r["attempt"] == 1]
    assert retried["outputs"]["seen"] == {"state": {"by": first["id"]}}
    state = _state(api)
    assert state["current_version"] == 2 and state["state"] == {"by": retried["id"]}


def test_the_state_versions_page_with_a_cursor(api: httpx.Client, tmp_path: Path) -> None:
    _deploy(api, tmp_path)
    for count in range(3):
        api.put("/api/v1/workers/counter/state", json={"state": count})

    page = api.get("/api/v1/workers/counter/state/versions", params={"limit": 2}).json()
    rest = api.get(
        "/api/v1/workers/counter/state/versions", params={"cursor": page["next_cursor"]}
    ).json()

    assert [v["version"] for v in page["items"]] == [3, 2]
    assert [v["version"] for v in rest["items"]] == [1] and rest["next_cursor"] is None


def test_an_operator_gets_sets_restores_and_lists_the_state_with_the_cli(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 100}"))

    empty = cli(server, "state", "get", "counter")
    assert empty.returncode == 0 and empty.stdout.strip() == "null"
    assert "no state yet" in empty.stderr
    done = cli(server, "state", "set", "counter", '{"count": 7}')
    assert done.returncode == 0, done.stderr
    assert "state version 1" in done.stdout and "operator" in done.stdout
    piped = cli(server, "state", "set", "counter", "-", stdin='{"count": 8}')
    assert piped.returncode == 0, piped.stderr

    got = cli(server, "state", "get", "counter")
    assert json.loads(got.stdout) == {"count": 8} and "state version 2" in got.stderr
    old = cli(server, "state", "get", "counter", "--version", "1")
    assert json.loads(old.stdout) == {"count": 7}

    not_json = cli(server, "state", "set", "counter", "{count: 9")
    too_large = cli(server, "state", "set", "counter", json.dumps({"pad": "x" * 200}))
    stale = cli(server, "state", "set", "counter", "1", "--if-version", "1")
    assert not_json.returncode != 0 and "not valid JSON" in not_json.stderr
    assert too_large.returncode == 1 and "state is" in too_large.stderr
    assert "FLOOM_MAX_STATE_BYTES" in too_large.stderr
    assert stale.returncode == 1 and "version 2" in stale.stderr
    assert _state(api)["current_version"] == 2

    restored = cli(server, "state", "set", "counter", "--from-version", "1")
    assert restored.returncode == 0 and "restored from 1" in restored.stdout
    history = cli(server, "state", "history", "counter", "--json")
    versions = json.loads(history.stdout)["items"]
    assert [(v["version"], v["source"]) for v in versions] == [
        (3, "restore"),
        (2, "operator"),
        (1, "operator"),
    ]
    table = cli(server, "state", "history", "counter")
    assert table.returncode == 0 and "restore of 1" in table.stdout


def test_a_read_key_reads_the_state_but_cannot_set_it(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]

    with server.client(key) as reader:
        assert reader.get("/api/v1/workers/counter/state").status_code == 200
        refused = reader.put("/api/v1/workers/counter/state", json={"state": 1})

    assert refused.status_code == 403
    assert _state(api)["current_version"] == 0


def test_a_rollback_may_restore_an_earlier_state_and_refuses_one_not_kept(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    first = api.get("/api/v1/workers/counter").json()["active_version_id"]
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 1}})
    _deploy(api, tmp_path, COUNTER_YML + "description: second\n")
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 2}})

    missing = cli(server, "rollback", "counter", "--to", first, "--restore-state", "9")
    assert missing.returncode == 1
    assert api.get("/api/v1/workers/counter").json()["active_version_id"] != first
    done = cli(server, "rollback", "counter", "--to", first, "--restore-state", "1")

    assert done.returncode == 0, done.stderr
    assert api.get("/api/v1/workers/counter").json()["active_version_id"] == first
    state = _state(api)
    assert state["state"] == {"count": 1} and state["written"]["restored_from"] == 1


def test_the_worker_page_shows_sets_and_restores_the_state(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    run = _run(api)
    client = signed_in_client(server, server.admin_key)

    page = client.get("/workers/counter")
    assert page.status_code == 200 and 'id="state"' in page.text
    assert run["id"] in page.text and "&#34;count&#34;: 1" in page.text

    bad = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "state": "{count: 2"}
    )
    assert bad.status_code == 422 and "not valid JSON" in bad.text
    assert _state(api)["current_version"] == 1
    done = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "state": '{"count": 5}'}
    )
    assert done.status_code == 303 and done.headers["location"].endswith("#state")
    assert _state(api)["state"] == {"count": 5}
    restored = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "from_version": "1"}
    )
    assert restored.status_code == 303
    assert _state(api)["state"]["run"] == run["id"]
    assert "Restore 2" in client.get("/workers/counter").text

    key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]
    reader = signed_in_client(server, key)
    shown = reader.get("/workers/counter")
    assert 'id="state"' in shown.text and "Set state" not in shown.text
    refused = reader.post(
        "/workers/counter/state", data={"csrf": csrf_of(shown.text), "state": "1"}
    )
    assert refused.status_code == 403 and _state(api)["current_version"] == 3


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_mcp_tools_read_set_and_list_the_state_in_the_server_and_over_stdio(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    read_key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]

    async def session() -> None:
        async with http_client(server) as mcp:
            empty = await call(mcp, "get_worker_state", worker="counter")
            assert empty["current_version"] == 0 and empty["state"] is None
            written = await call(mcp, "set_worker_state", worker="counter", state={"n": 1})
            assert written["version"] == 1 and written["written"]["source"] == "operator"
            both = await call_error(
                mcp, "set_worker_state", worker="counter", state={"n": 2}, from_version=1
            )
            assert "exactly one" in both["message"]
        async with stdio_client(server) as mcp:
            await call(mcp, "set_worker_state", worker="counter", state={"n": 2})
            stale = await call_error(
                mcp, "set_worker_state", worker="counter", state={"n": 3}, if_version=1
            )
            assert stale["code"] == "state_conflict"
            old = await call(mcp, "get_worker_state", worker="counter", version=1)
            assert old["state"] == {"n": 1} and old["current_version"] == 2
            page = await call(mcp, "list_worker_state_versions", worker="counter")
            assert [v["version"] for v in page["items"]] == [2, 1]
        async with stdio_client(server, read_key) as mcp:
            refused = await call_error(mcp, "set_worker_state", worker="counter", state=0)
            assert refused["code"] == "forbidden"

    anyio.run(session)
    assert _state(api)["state"] == {"n": 2}


def test_a_deleted_worker_deployed_again_starts_without_state(
    api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path)
    _run(api)
    assert api.request("DELETE", "/api/v1/workers/counter").status_code == 200

    _deploy(api, tmp_path)

    assert _state(api)["current_version"] == 0
    assert api.get("/api/v1/workers/counter/state/versions").json()["items"] == []
    assert _run(api)["outputs"]["seen"] == {"state": None}


def test_an_agent_reads_its_state_with_a_tool_and_leaves_the_next_with_finish(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as rig:
        rig.deploy(agent_worker(tmp_path / "keeper", "name: keeper\nstate: {max_bytes: 100}\n"))
        rig.model.script(
            reply(tool_use("read_state")),
            reply(tool_use("finish", {"outputs": {}, "state": {"n": 1}})),
        )
        first = wait_status(rig.api, start_run(rig.api, "keeper"))
        rig.model.script(
            reply(tool_use("read_state")),
            reply(tool_use("finish", {"outputs": {}, "state": {"pad": "x" * 200}})),
            reply(tool_use("finish", {"outputs": {}, "state": {"n": 2}})),
        )
        second = wait_status(rig.api, start_run(rig.api, "keeper"))
        assert "read_state" in rig.model.tool_names(0)
        finish_schema = next(t for t in rig.model.requests[0]["tools"] if t["name"] == "finish")[
            "input_schema"
        ]
        state = rig.api.get("/api/v1/workers/keeper/state").json()

    assert first["status"] == second["status"] == "succeeded", (first, second)
    assert "state" in finish_schema["properties"]
    assert json.loads(first["tool_calls"][0]["result"]) == {"version": 0, "state": None}
    assert json.loads(second["tool_calls"][0]["result"]) == {"version": 1, "state": {"n": 1}}
    refused = second["tool_calls"][1]
    assert refused["status"] == "error" and "at most 100" in refused["error"]
    assert state["current_version"] == 2 and state["state"] == {"n": 2}
    assert state["written"]["run_id"] == second["id"]


def test_state_in_worker_yml_is_checked_exported_and_held_to_the_servers_ceiling(
    tmp_path: Path,
) -> None:
    files = frozenset({"run.py"})
    assert parse_manifest("name: a\nstate: true\n", files).state.enabled is True
    assert parse_manifest("name: a\n", files).state.enabled is False
    spec = parse_manifest("name: a\nstate: {on_conflict: retry}\n", files).state
    assert spec.enabled and spec.on_conflict == "retry" and spec.max_bytes is None
    with pytest.raises(ManifestInvalid) as bad:
        parse_manifest("name: a\nstate: {on_conflict: never, max_bytes: 1}\n", files)
    paths = sorted(d["path"] for d in bad.value.details)
    assert paths == ["state.max_bytes", "state.on_conflict"]
    schema = manifest_json_schema()
    assert schema["properties"]["state"]["anyOf"][0] == {"type": "boolean"}
    assert set(schema["$defs"]["StateSpec"]["properties"]) == {
        "enabled",
        "on_conflict",
        "max_bytes",
    }

    settings = fast_settings(tmp_path, "sqlite://", max_state_bytes=1000)
    over = parse_manifest("name: a\nstate: {max_bytes: 5000}\n", files)
    (problem,) = over_ceilings(over, settings)
    assert problem.path == "state.max_bytes" and "FLOOM_MAX_STATE_BYTES" in problem.message
    assert over_ceilings(parse_manifest("name: a\nstate: true\n", files), settings) == []
