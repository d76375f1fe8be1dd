"""A worker's state on its page in the web UI, over plain HTTP: shown, set, restored; a read key
sees it and cannot set it."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.harness import LiveServer
from tests.support.rigs.state import COUNTER_YML, counter_state, deploy_counter, run_counter
from tests.support.web import csrf_of, signed_in_client


def test_the_worker_page_shows_sets_and_restores_the_state(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    run = run_counter(api)
    client = signed_in_client(server, server.admin_key)

    page = client.get("/workers/counter")
    assert page.status_code == 200
    assert 'id="state"' in page.text
    assert run["id"] in page.text
    assert "&#34;count&#34;: 1" in page.text

    bad = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "state": "{count: 2"}
    )
    assert bad.status_code == 422
    assert "not valid JSON" in bad.text
    assert counter_state(api)["current_version"] == 1
    done = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "state": '{"count": 5}'}
    )
    assert done.status_code == 303
    assert done.headers["location"].endswith("#state")
    assert counter_state(api)["state"] == {"count": 5}
    restored = client.post(
        "/workers/counter/state", data={"csrf": csrf_of(page.text), "from_version": "1"}
    )
    assert restored.status_code == 303
    assert counter_state(api)["state"]["run"] == run["id"]
    assert "Restore 2" in client.get("/workers/counter").text

    key = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]
    reader = signed_in_client(server, key)
    shown = reader.get("/workers/counter")
    assert 'id="state"' in shown.text
    assert "Set state" not in shown.text
    refused = reader.post(
        "/workers/counter/state", data={"csrf": csrf_of(shown.text), "state": "1"}
    )
    assert refused.status_code == 403
    assert counter_state(api)["current_version"] == 3


def test_rolling_back_from_the_worker_page_can_restore_a_kept_state_with_the_code(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path / "a")
    deploy_counter(api, tmp_path / "b", COUNTER_YML.replace("state: true", "state: {}"))
    newest, oldest = [v["id"] for v in api.get("/api/v1/workers/counter/versions").json()["items"]]
    for n in (1, 2):
        api.put("/api/v1/workers/counter/state", json={"state": {"n": n}})
    client = signed_in_client(server, server.admin_key)
    page = client.get("/workers/counter")
    assert "restore version 1" in page.text

    def active() -> str:
        return str(api.get("/api/v1/workers/counter").json()["active_version_id"])

    form = {"csrf": csrf_of(page.text), "version_id": oldest}
    gone = client.post("/workers/counter/rollback", data={**form, "state_version": "99"})
    assert gone.status_code == 404
    assert "no state version 99" in gone.text
    bad = client.post("/workers/counter/rollback", data={**form, "state_version": "one"})
    assert bad.status_code == 400
    assert "state_version" in bad.text
    assert (active(), counter_state(api)["state"]) == (newest, {"n": 2})  # nothing changed

    done = client.post("/workers/counter/rollback", data={**form, "state_version": "1"})
    assert done.status_code == 303
    assert (active(), counter_state(api)["state"]) == (oldest, {"n": 1})
    plain = client.post(
        "/workers/counter/rollback", data={**form, "version_id": newest, "state_version": ""}
    )
    assert plain.status_code == 303
    assert (active(), counter_state(api)["state"]) == (newest, {"n": 1})  # state kept
