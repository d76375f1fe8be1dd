"""A worker's state on its page in the web UI, over plain HTTP: shown, set, restored; a read key
sees it and cannot set it."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.harness import LiveServer
from tests.support.state import counter_state, deploy_counter, run_counter
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
