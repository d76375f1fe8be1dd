"""Worker state with real parts: a script in the bubblewrap sandbox reads state.json and leaves
a new state in result.json, committed only with the run's success; concurrent runs on
PostgreSQL end one committed, one `state_conflict`; an oversized or non-JSON state is refused
naming the field and changes nothing; an operator reads, sets and restores it over REST; a
replay starts from its original's state. On SQLite and PostgreSQL unless said."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.support.harness import LiveServer, live_server, wait_for_run, wait_until
from tests.support.rigs.agents import start_run
from tests.support.rigs.state import (
    COUNTER_PY,
    COUNTER_YML,
    counter_state,
    deploy_counter,
    run_counter,
)


def test_a_script_reads_the_state_its_last_success_left_and_leaves_the_next(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    assert counter_state(api)["current_version"] == 0
    assert counter_state(api)["state"] is None

    first = run_counter(api)
    second = run_counter(api)

    assert first["status"] == "succeeded", first
    assert first["outputs"]["seen"] == {"state": None}
    assert second["outputs"]["seen"] == {"state": {"count": 1, "run": first["id"]}}
    state = counter_state(api)
    assert state["enabled"] is True
    assert state["current_version"] == 2
    assert state["state"] == {"count": 2, "run": second["id"]}
    assert state["written"]["written_by"] == f"run:{second['id']}"
    assert state["written"]["run_id"] == second["id"]
    assert state["written"]["source"] == "run"
    versions = api.get("/api/v1/workers/counter/state/versions").json()["items"]
    assert [(v["version"], v["run_id"]) for v in versions] == [(2, second["id"]), (1, first["id"])]
    older = api.get("/api/v1/workers/counter/state", params={"version": 1}).json()
    assert older["state"] == {"count": 1, "run": first["id"]}
    assert older["current_version"] == 2


def test_a_failed_run_changes_no_state_even_when_it_left_one(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    ok = run_counter(api)

    failed = run_counter(api, fail=True)

    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "worker_error"
    state = counter_state(api)
    assert state["current_version"] == 1
    assert state["state"]["run"] == ok["id"]
    assert len(api.get("/api/v1/workers/counter/state/versions").json()["items"]) == 1


def test_an_oversized_state_fails_the_run_naming_the_field_and_changes_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 200}"))
    run_counter(api)

    run = run_counter(api, big=500)

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "state_too_large"
    assert "state is" in run["error"]["message"]
    assert "at most 200" in run["error"]["message"]
    assert counter_state(api)["current_version"] == 1


def test_a_worker_without_state_gets_no_state_json_and_its_state_is_ignored(
    api: httpx.Client, tmp_path: Path
) -> None:
    py = COUNTER_PY.replace('json.load(open("state.json"))', 'os.path.exists("state.json")')
    deploy_counter(api, tmp_path, COUNTER_YML.replace("state: true\n", ""), py)

    run = run_counter(api)

    assert run["status"] == "succeeded"
    assert run["outputs"]["seen"] == {"state": False}
    assert counter_state(api)["current_version"] == 0
    assert counter_state(api)["enabled"] is False


def test_an_operator_sets_restores_and_compares_and_sets_the_state_over_rest(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    put = api.put("/api/v1/workers/counter/state", json={"state": {"count": 41}})
    assert put.status_code == 200, put.text
    assert put.json()["written"]["source"] == "operator"
    assert put.json()["version"] == 1

    run = run_counter(api)
    assert run["outputs"]["seen"] == {"state": {"count": 41}}
    assert counter_state(api)["state"]["count"] == 42

    stale = api.put("/api/v1/workers/counter/state", json={"state": {}, "if_version": 1})
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "state_conflict"
    restored = api.put("/api/v1/workers/counter/state", json={"from_version": 1})
    assert restored.status_code == 200, restored.text
    body = restored.json()
    assert body["version"] == 3
    assert body["state"] == {"count": 41}
    assert body["written"]["source"] == "restore"
    assert body["written"]["restored_from"] == 1


def test_bad_state_from_an_operator_is_refused_clearly_and_changes_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 100}"))
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

    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "state_too_large"
    assert too_large.json()["error"]["details"][0]["path"] == "state"
    assert "FLOOM_MAX_STATE_BYTES" in too_large.json()["error"]["hint"]
    assert not_json.status_code == 422
    assert both.status_code == 400
    assert "exactly one" in both.json()["error"]["message"]
    assert missing.status_code == 404
    assert deep.status_code == 422
    assert deep.json()["error"]["code"] == "state_invalid"
    state = counter_state(api)
    assert state["current_version"] == 1
    assert state["state"] == {"count": 1}


def test_a_replay_starts_from_its_originals_state_and_never_overwrites_a_newer_one(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    first = run_counter(api)
    second = run_counter(api)

    replay = api.post(f"/api/v1/runs/{second['id']}/replay", json={})
    assert replay.status_code in (200, 201, 202), replay.text
    replayed = wait_for_run(api, replay.json()["id"])

    # The state second started from (version 1, written by first), not the current one.
    assert replayed["outputs"]["seen"] == {"state": {"count": 1, "run": first["id"]}}
    assert second["state_base"] == replayed["state_base"] == 1
    assert first["state_base"] == 0
    assert replayed["status"] == "failed"
    assert replayed["error"]["code"] == "state_conflict"
    assert counter_state(api)["state"]["run"] == second["id"]


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
    deploy_counter(api, tmp_path, COUNTER_YML, RACER_PY)
    runs = [start_run(api, "counter"), start_run(api, "counter")]

    # Both have read state.json (version 0) before either may finish.
    outputs = [wait_until(functools.partial(_ready, server, r, 1), timeout=30) for r in runs]
    for output in outputs:
        (output / "go").touch()
    ended = [wait_for_run(api, run_id) for run_id in runs]

    statuses = sorted((r["status"], (r["error"] or {}).get("code")) for r in ended)
    assert statuses == [("failed", "state_conflict"), ("succeeded", None)], ended
    (winner,) = [r for r in ended if r["status"] == "succeeded"]
    state = counter_state(api)
    assert state["current_version"] == 1
    assert state["state"] == {"by": winner["id"]}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_with_on_conflict_retry_the_losing_run_runs_again_from_the_winners_state(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    manifest = COUNTER_YML.replace("state: true", "state: {on_conflict: retry}")
    deploy_counter(api, tmp_path, manifest, RACER_PY)
    runs = [start_run(api, "counter"), start_run(api, "counter")]
    outputs = [wait_until(functools.partial(_ready, server, r, 1), timeout=30) for r in runs]
    for output in outputs:
        (output / "go").touch()

    again = wait_until(lambda: _ready(server, runs[0], 2) or _ready(server, runs[1], 2))
    (again / "go").touch()
    ended = [wait_for_run(api, run_id) for run_id in runs]

    assert [r["status"] for r in ended] == ["succeeded", "succeeded"], ended
    (retried,) = [r for r in ended if r["attempt"] == 2]
    (first,) = [r for r in ended if r["attempt"] == 1]
    assert retried["outputs"]["seen"] == {"state": {"by": first["id"]}}
    state = counter_state(api)
    assert state["current_version"] == 2
    assert state["state"] == {"by": retried["id"]}


def test_the_state_versions_page_with_a_cursor(api: httpx.Client, tmp_path: Path) -> None:
    deploy_counter(api, tmp_path)
    for count in range(3):
        api.put("/api/v1/workers/counter/state", json={"state": count})

    page = api.get("/api/v1/workers/counter/state/versions", params={"limit": 2}).json()
    rest = api.get(
        "/api/v1/workers/counter/state/versions", params={"cursor": page["next_cursor"]}
    ).json()

    assert [v["version"] for v in page["items"]] == [3, 2]
    assert [v["version"] for v in rest["items"]] == [1]
    assert rest["next_cursor"] is None


def test_a_read_key_reads_the_state_but_cannot_set_it(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]

    with server.client(key) as reader:
        assert reader.get("/api/v1/workers/counter/state").status_code == 200
        refused = reader.put("/api/v1/workers/counter/state", json={"state": 1})

    assert refused.status_code == 403
    assert counter_state(api)["current_version"] == 0


def test_a_deleted_worker_deployed_again_starts_without_state(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    run_counter(api)
    assert api.request("DELETE", "/api/v1/workers/counter").status_code == 200

    deploy_counter(api, tmp_path)

    assert counter_state(api)["current_version"] == 0
    assert api.get("/api/v1/workers/counter/state/versions").json()["items"] == []
    assert run_counter(api)["outputs"]["seen"] == {"state": None}


LEAKY_YML = """\
name: counter
state: true
secrets: [STATE_TOKEN]
"""
LEAKY_PY = """\
import json, os
json.dump({"outputs": {}, "state": {"token": os.environ["STATE_TOKEN"], "n": 1}},
          open("result.json", "w"))
"""


def test_secret_values_in_a_state_are_masked_before_it_is_stored_whoever_writes_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    token = "st4te-Secret-Value-0042"
    deploy_counter(api, tmp_path, LEAKY_YML, LEAKY_PY)
    api.put("/api/v1/secrets/STATE_TOKEN", json={"value": token})

    run = run_counter(api)
    by_run = counter_state(api)
    api.put("/api/v1/workers/counter/state", json={"state": {"copied": f"x{token}x"}})
    by_operator = counter_state(api)

    assert run["status"] == "succeeded", run
    assert by_run["state"] == {"token": "***", "n": 1}
    assert by_operator["state"] == {"copied": "x***x"}
    versions = api.get("/api/v1/workers/counter/state/versions").text
    assert token not in versions
    assert token not in json.dumps([by_run, by_operator])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_last_hundred_versions_are_kept_and_a_replay_from_an_older_one_is_refused(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 0}})
    run = run_counter(api)
    assert run["state_base"] == 1
    for count in range(100):
        api.put("/api/v1/workers/counter/state", json={"state": {"count": count}})

    kept = api.get("/api/v1/workers/counter/state/versions", params={"limit": 500}).json()
    refused = api.post(f"/api/v1/runs/{run['id']}/replay", json={})

    assert [v["version"] for v in kept["items"]] == list(range(102, 2, -1))
    assert refused.status_code == 404, refused.text
    assert "state version 1" in refused.json()["error"]["message"]
    assert len(api.get("/api/v1/runs", params={"worker": "counter"}).json()["items"]) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_versions_kept_follow_floom_state_history(tmp_path: Path, database_url: str) -> None:
    with live_server(tmp_path / "d", database_url, state_history=3) as srv, srv.client() as api:
        deploy_counter(api, tmp_path)
        for count in range(4):
            api.put("/api/v1/workers/counter/state", json={"state": {"count": count}})
        run = run_counter(api)  # a run's write keeps the same number
        assert run["status"] == "succeeded"
        kept = api.get("/api/v1/workers/counter/state/versions").json()
        assert [v["version"] for v in kept["items"]] == [5, 4, 3]
        assert [v["source"] for v in kept["items"]] == ["run", "operator", "operator"]
        gone = api.get("/api/v1/workers/counter/state", params={"version": 2})
        assert gone.status_code == 404


TAMPER_YML = """\
name: tamper
state: true
{warm}outputs:
  tried: {{type: object}}
  seen: {{type: object}}
  pid: {{type: integer}}
"""
# Tries every way to change the state.json it was given, then reads it again.
TAMPER_PY = """\
import json, os
tried = {}
for what, act in (
    ("write", lambda: open("state.json", "w").write('{"count": 999}')),
    ("append", lambda: open("state.json", "a").write(" ")),
    ("chmod", lambda: os.chmod("state.json", 0o666)),
    ("rename", lambda: os.rename("state.json", "moved.json")),
    ("remove", lambda: os.remove("state.json")),
):
    try:
        act()
        tried[what] = "done"
    except OSError as exc:
        tried[what] = "refused"
seen = json.load(open("state.json"))
result = {"outputs": {"tried": tried, "seen": seen, "pid": os.getpid()}, "state": seen}
json.dump(result, open("result.json", "w"))
"""


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_run_cannot_change_the_state_json_it_was_given(
    api: httpx.Client, tmp_path: Path, warm: bool
) -> None:
    if warm and os.geteuid() != 0:
        pytest.skip("warm starts need a root floom")
    manifest = TAMPER_YML.format(warm="warm: true\n" if warm else "")
    deploy_counter(api, tmp_path, manifest, TAMPER_PY)
    api.put("/api/v1/workers/tamper/state", json={"state": {"count": 1}})
    until = time.monotonic() + (60.0 if warm else 0.0)
    while True:
        run = wait_for_run(api, start_run(api, "tamper", {}))
        assert run["status"] == "succeeded", run
        if not warm or run["outputs"]["pid"] == 1 or time.monotonic() > until:
            break
    if warm:
        assert run["outputs"]["pid"] == 1, "no run started warm"
    assert run["outputs"]["tried"] == dict.fromkeys(
        ("write", "append", "chmod", "rename", "remove"), "refused"
    )
    assert run["outputs"]["seen"] == {"count": 1}
