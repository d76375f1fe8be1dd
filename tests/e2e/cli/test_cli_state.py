"""`floom state get|set|history` and `floom rollback --restore-state` against a live server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.support.cli import cli
from tests.support.harness import LiveServer
from tests.support.rigs.state import COUNTER_YML, counter_state, deploy_counter


def test_an_operator_gets_sets_restores_and_lists_the_state_with_the_cli(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path, COUNTER_YML.replace("state: true", "state: {max_bytes: 100}"))

    empty = cli(server, "state", "get", "counter")
    assert empty.returncode == 0
    assert empty.stdout.strip() == "null"
    assert "no state yet" in empty.stderr
    done = cli(server, "state", "set", "counter", '{"count": 7}')
    assert done.returncode == 0, done.stderr
    assert "state version 1" in done.stdout
    assert "operator" in done.stdout
    piped = cli(server, "state", "set", "counter", "-", stdin='{"count": 8}')
    assert piped.returncode == 0, piped.stderr

    got = cli(server, "state", "get", "counter")
    assert json.loads(got.stdout) == {"count": 8}
    assert "state version 2" in got.stderr
    old = cli(server, "state", "get", "counter", "--version", "1")
    assert json.loads(old.stdout) == {"count": 7}

    not_json = cli(server, "state", "set", "counter", "{count: 9")
    too_large = cli(server, "state", "set", "counter", json.dumps({"pad": "x" * 200}))
    stale = cli(server, "state", "set", "counter", "1", "--if-version", "1")
    assert not_json.returncode != 0
    assert "not valid JSON" in not_json.stderr
    assert too_large.returncode == 1
    assert "state is" in too_large.stderr
    assert "FLOOM_MAX_STATE_BYTES" in too_large.stderr
    assert stale.returncode == 1
    assert "version 2" in stale.stderr
    assert counter_state(api)["current_version"] == 2

    restored = cli(server, "state", "set", "counter", "--from-version", "1")
    assert restored.returncode == 0
    assert "restored from 1" in restored.stdout
    history = cli(server, "state", "history", "counter", "--json")
    versions = json.loads(history.stdout)["items"]
    assert [(v["version"], v["source"]) for v in versions] == [
        (3, "restore"),
        (2, "operator"),
        (1, "operator"),
    ]
    table = cli(server, "state", "history", "counter")
    assert table.returncode == 0
    assert "restore of 1" in table.stdout


def test_a_rollback_may_restore_an_earlier_state_and_refuses_one_not_kept(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    first = api.get("/api/v1/workers/counter").json()["active_version_id"]
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 1}})
    deploy_counter(api, tmp_path, COUNTER_YML + "description: second\n")
    api.put("/api/v1/workers/counter/state", json={"state": {"count": 2}})

    missing = cli(server, "rollback", "counter", "--to", first, "--restore-state", "9")
    assert missing.returncode == 1
    assert api.get("/api/v1/workers/counter").json()["active_version_id"] != first
    bogus = cli(server, "rollback", "counter", "--to", "v000000000000", "--restore-state", "1")
    assert bogus.returncode == 1
    assert counter_state(api)["state"] == {"count": 2}
    done = cli(server, "rollback", "counter", "--to", first, "--restore-state", "1")

    assert done.returncode == 0, done.stderr
    assert api.get("/api/v1/workers/counter").json()["active_version_id"] == first
    state = counter_state(api)
    assert state["state"] == {"count": 1}
    assert state["written"]["restored_from"] == 1
