"""Numbers that callers write as text (a header, a query, a form field) are read as numbers
floom can use, or refused as a 4xx naming them: never a 500, whatever digits they hold
(superscripts, other scripts' digits, thousands of them, past what the database stores)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.rigs.state import deploy_counter
from tests.support.web import csrf_of, signed_in_client

ODD = ("\u00b2", "\u0663", "9" * 5000, "9" * 30, "-1", "1e3", "+7")


def _run(api: httpx.Client, tmp_path: Path) -> str:
    deploy_folder(api, make_worker(tmp_path / "w", "name: w\n", {"run.py": "print('hi')\n"}))
    run = wait_for_run(api, api.post("/api/v1/workers/w/runs", json={}).json()["id"])
    assert run["status"] == "succeeded", run
    return str(run["id"])


def test_a_log_stream_s_last_event_id_and_after_of_any_digits_are_never_a_500(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    run_id = _run(api, tmp_path)
    web = signed_in_client(server, server.admin_key)
    for value in ODD:
        for client, path in (
            (api, f"/api/v1/runs/{run_id}/logs/stream"),
            (web, f"/runs/{run_id}/logs/stream"),
        ):
            resp = client.get(path, headers={b"Last-Event-ID": value.encode("utf-8")})
            assert resp.status_code < 500, (path, value[:20], resp.status_code, resp.text[:300])
            resp = client.get(path, params={"after": value})
            assert resp.status_code < 500, (path, value[:20], resp.status_code, resp.text[:300])
        resp = api.get(f"/api/v1/runs/{run_id}/logs", params={"after": value})
        assert resp.status_code < 500, (value[:20], resp.status_code, resp.text[:300])


def test_the_web_ui_s_state_version_fields_of_any_digits_are_refused_never_a_500(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_counter(api, tmp_path)
    web = signed_in_client(server, server.admin_key)
    page = web.get("/workers/counter")
    csrf = csrf_of(page.text)
    for value in ODD:
        resp = web.post("/workers/counter/state", data={"csrf": csrf, "from_version": value})
        assert resp.status_code in (400, 404, 422), (value[:20], resp.status_code)
        resp = web.post(
            "/workers/counter/rollback",
            data={"csrf": csrf, "version_id": "v_x", "state_version": value},
        )
        assert resp.status_code in (400, 404, 422), (value[:20], resp.status_code)


def test_the_web_ui_s_channel_port_of_any_digits_is_refused_never_a_500(
    server: LiveServer,
) -> None:
    web = signed_in_client(server, server.admin_key)
    csrf = csrf_of(web.get("/alerts").text)
    for value in ODD:
        resp = web.post(
            "/alerts/channels",
            data={
                "csrf": csrf,
                "name": "mail",
                "kind": "email",
                "host": "mail.example.com",
                "port": value,
                "sender": "floom@example.com",
                "to": "ops@example.com",
            },
        )
        assert resp.status_code in (400, 422), (value[:20], resp.status_code)
