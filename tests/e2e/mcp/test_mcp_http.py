"""The MCP endpoint at /mcp on the floom server, through the SDK's own Streamable HTTP client."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request

from floom.config import Settings
from floom.mcp.http import transport_security
from floom.mcp.tools import core as mcp_core
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.vocabulary import ApprovalKind
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.mcp_clients import (
    CALL_TIMEOUT,
    FLOOM_TOOLS,
    call,
    call_error,
    call_raw,
    http_client,
    text_of,
    worker_files,
)
from tests.support.web import signed_in_client

SHOUT_YML = """\
name: shout
description: Shouts a text back.
inputs:
  text: {type: string, required: true, description: what to shout}
  times: {type: integer, default: 1}
outputs:
  shouted: {type: string, required: true}
expose: [mcp]
"""
SHOUT_PY = """\
import json
inputs = json.load(open("inputs.json"))
shouted = inputs["text"].upper() * inputs["times"]
json.dump({"outputs": {"shouted": shouted}}, open("result.json", "w"))
"""
SCHEDULED_YML = """\
name: nightly
triggers:
  - schedule: {cron: "0 3 * * *", timezone: Europe/Berlin}
  - schedule: {cron: "0 4 * * *", timezone: Europe/Berlin}
"""


def test_the_endpoint_serves_every_tool_and_deploys_a_folder_sent_as_files(
    server: LiveServer,
) -> None:
    async def session() -> None:
        async with http_client(server) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(listed) >= FLOOM_TOOLS
            # The server cannot read the caller's folders, so its tools offer `files` only.
            for tool in ("deploy_worker", "validate_worker"):
                offered = listed[tool].input_schema["properties"]
                assert "files" in offered
                assert "files_base64" in offered
                assert "folder" not in offered, tool
                assert "`folder`" not in (listed[tool].description or ""), tool
            refused = await call_error(mcp, "deploy_worker", folder=str(EXAMPLES / "hello"))
            assert refused["code"] == "invalid_request"
            assert "`files`" in refused["message"]
            assert "`files`" in refused["hint"]
            refused = await call_error(mcp, "deploy_worker")
            assert "`files`" in refused["hint"]
            assert "`folder`" not in refused["hint"]
            checked = await call(mcp, "validate_worker", files={"worker.yml": "name: Bad Name"})
            assert checked["valid"] is False
            assert checked["problems"]
            deployed = await call(mcp, "deploy_worker", files=worker_files(EXAMPLES / "hello"))
            assert deployed["created"] is True
            result = await call_raw(
                mcp, "run_worker", worker="hello", inputs={"name": "Ada"}, wait_seconds=30
            )
            assert "Hello, Ada!" in text_of(result)
            # The data once, as structured content; the text is a summary, not a JSON copy.
            assert len(result.content) == 1
            assert not text_of(result).startswith("{")
            run = (result.structured_content or {})["run"]
            assert run["status"] == "succeeded"
            assert run["trigger"] == "mcp"

    anyio.run(session)


def test_a_read_key_can_look_but_is_refused_running_or_deploying_naming_the_scope(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")

    async def session() -> None:
        async with http_client(server, read_key) as mcp:
            listed = await call(mcp, "list_workers")
            assert [w["name"] for w in listed["items"]] == ["hello"]
            # hello names no `expose`: every surface may start it, and the listing says so.
            assert sorted(listed["items"][0]["expose"]) == ["mcp", "rest", "ui"]
            refused = await call_error(mcp, "run_worker", worker="hello")
            assert refused["code"] == "forbidden"
            assert "'run'" in refused["message"]
            # Named for an MCP client: the scope it needs, not a CLI command it may not have.
            assert "'run' scope" in refused["hint"]
            assert "floom keys" not in refused["hint"]
            files = worker_files(EXAMPLES / "hello")
            refused = await call_error(mcp, "deploy_worker", files=files)
            assert refused["code"] == "forbidden"
            assert "'deploy'" in refused["message"]
            refused = await call_error(mcp, "set_secret", name="SOME_TOKEN", value="abcdef")
            assert refused["code"] == "forbidden"

    anyio.run(session)
    assert api.get("/api/v1/runs").json()["items"] == []
    assert api.get("/api/v1/secrets").json()["items"] == []


def test_a_request_without_a_valid_key_is_refused_before_it_reaches_mcp(
    server: LiveServer,
) -> None:
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["admin"], name="soon revoked")
    keys.revoke_key(server.ctx, caller=SYSTEM, key_id=key.id)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for auth in ("", "Bearer flm_wrong", f"Bearer {token}"):
        headers = {"Authorization": auth} if auth else {}
        resp = httpx.post(f"{server.base_url}/mcp", json=body, headers=headers, timeout=10)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"
        assert resp.headers["www-authenticate"] == "Bearer"


def test_a_foreign_host_header_is_refused_with_a_hint_to_set_the_public_url(
    server: LiveServer,
) -> None:
    resp = httpx.post(
        f"{server.base_url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"Authorization": f"Bearer {server.admin_key}", "Host": "evil.example"},
        timeout=10,
    )
    assert resp.status_code == 421
    assert resp.json()["error"]["code"] == "host_not_allowed"
    assert "FLOOM_PUBLIC_URL" in resp.json()["error"]["hint"]


def test_behind_a_proxy_the_public_url_host_is_accepted(tmp_path: Path, database_url: str) -> None:
    public = "https://floom.example.com"
    with live_server(tmp_path / "data", database_url, public_url=public) as proxied:

        async def session() -> None:
            async with http_client(proxied, host="floom.example.com") as mcp:
                assert (await call(mcp, "list_workers"))["items"] == []

        anyio.run(session)


@pytest.mark.parametrize(
    ("host", "origin", "allowed"),
    [
        ("127.0.0.1:8321", None, True),
        ("localhost:9999", "http://localhost:9999", True),
        ("floom.example.com", "https://floom.example.com", True),
        ("floom.example.com:443", None, True),
        ("evil.example", None, False),
        ("floom.example.com.evil.example", None, False),
        ("127.0.0.1:8321", "https://evil.example", False),
    ],
)
def test_the_rebinding_guard_allows_loopback_and_the_public_host_only(
    host: str, origin: str | None, allowed: bool
) -> None:
    settings = Settings(host="0.0.0.0", public_url="https://floom.example.com")
    guard = TransportSecurityMiddleware(transport_security(settings))
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    request = Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})
    refusal = anyio.run(guard.validate_request, request)
    assert (refusal is None) is allowed


def test_unknown_workers_runs_and_tools_and_bad_arguments_are_tool_errors_with_a_hint(
    server: LiveServer,
) -> None:
    async def session() -> None:
        async with http_client(server) as mcp:
            cases: list[tuple[str, dict[str, Any]]] = [
                ("get_worker", {"worker": "nope"}),
                ("run_worker", {"worker": "nope"}),
                ("list_versions", {"worker": "nope"}),
                ("get_run", {"run_id": "run_nope"}),
                ("watch_run", {"run_id": "run_nope", "timeout_seconds": 1}),
            ]
            for tool, args in cases:
                error = await call_error(mcp, tool, **args)
                assert error["code"] == "not_found", (tool, error)
                assert error["hint"], (tool, error)
            error = await call_error(mcp, "no_such_tool")
            assert error["code"] == "not_found"
            assert "no_such_tool" in error["message"]
            error = await call_error(mcp, "run_worker", worker="hello", wait_seconds=10_000)
            assert error["code"] == "invalid_request"
            assert "wait_seconds" in error["message"]

    anyio.run(session)


def test_a_worker_exposed_to_mcp_becomes_a_tool_and_listening_clients_hear_of_it(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    async def session() -> None:
        async with http_client(server) as mcp:
            assert "shout" not in {t.name for t in (await mcp.list_tools()).tools}
            async with mcp.listen(tools_list_changed=True) as changes:
                files = {"worker.yml": SHOUT_YML, "run.py": SHOUT_PY}
                await call(mcp, "deploy_worker", files=files)
                with anyio.fail_after(CALL_TIMEOUT):
                    async for _event in changes:
                        break
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            schema = tools["shout"].input_schema
            assert schema["required"] == ["text"]
            assert schema["properties"]["times"] == {"type": "integer", "default": 1}
            shouted = await call(mcp, "shout", text="hi", times=2)
            assert shouted["outputs"] == {"shouted": "HIHI"}
            assert shouted["status"] == "succeeded"
            bad = await call_error(mcp, "shout", times=2)
            assert bad["code"] == "input_invalid"
            assert "text" in bad["message"]

            # A deploy made elsewhere (REST) shows on the next listing.
            other = SHOUT_YML.replace("name: shout", "name: whisper")
            deploy_folder(api, make_worker(tmp_path / "whisper", other, {"run.py": SHOUT_PY}))
            assert "whisper" in {t.name for t in (await mcp.list_tools()).tools}

    anyio.run(session)


def test_worker_manifests_and_run_logs_are_resources(server: LiveServer, api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run_id = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "Ada"}}).json()["id"]
    wait_for_run(api, run_id)

    async def session() -> None:
        async with http_client(server) as mcp:
            uris = {str(r.uri) for r in (await mcp.list_resources()).resources}
            assert "floom://workers/hello/manifest" in uris
            manifest = await mcp.read_resource("floom://workers/hello/manifest")
            assert getattr(manifest.contents[0], "text", "").startswith("name: hello")
            logs = await mcp.read_resource(f"floom://runs/{run_id}/logs")
            assert "stdout: Hello, Ada!" in getattr(logs.contents[0], "text", "")
            with pytest.raises(MCPError, match="no worker named 'nope'"):
                await mcp.read_resource("floom://workers/nope/manifest")

    anyio.run(session)


def test_triggers_show_their_next_fires_and_a_worker_can_be_paused_and_resumed(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "nightly", SCHEDULED_YML, {"run.sh": "echo hi\n"}))
    deploy_folder(api, make_worker(tmp_path / "sleepy", "name: sleepy\n", {"run.sh": "sleep 60\n"}))

    async def session() -> None:
        async with http_client(server) as mcp:
            worker = await call(mcp, "get_worker", worker="nightly")
            trigger, _ = worker["triggers"]
            assert trigger["kind"] == "schedule"
            assert len(trigger["next_fires"]) == 3
            assert trigger["next_fires"][0].endswith(("+01:00", "+02:00"))
            # Paged, each trigger whole with its next fires (not cut mid-record).
            page = await call_raw(mcp, "list_triggers", worker="nightly", limit=1)
            first = page.structured_content or {}
            assert [t["id"] for t in first["items"]] == [trigger["id"]]
            assert first["next_cursor"]
            assert all(fire in text_of(page) for fire in trigger["next_fires"])
            rest = await call(mcp, "list_triggers", worker="nightly", cursor=first["next_cursor"])
            assert len(rest["items"]) == 1
            assert rest["next_cursor"] is None
            assert (await call(mcp, "pause_worker", worker="nightly"))["paused"] is True
            assert (await call(mcp, "get_worker", worker="nightly"))["paused"] is True
            refused = await call_error(mcp, "run_worker", worker="nightly")
            # The hint names the tool to call, not a CLI command an agent over HTTP lacks.
            assert refused["code"] == "worker_paused"
            assert "resume_worker(worker='nightly')" in refused["hint"]
            assert "`floom" not in refused["hint"]
            forced = await call(mcp, "run_worker", worker="nightly", force=True, wait_seconds=30)
            assert forced["run"]["status"] == "succeeded"
            assert (await call(mcp, "resume_worker", worker="nightly"))["paused"] is False
            # Cancelling says it was accepted and what state the run is in now.
            started = await call(mcp, "run_worker", worker="sleepy")
            cancel = await call_raw(mcp, "cancel_run", run_id=started["run"]["id"])
            cancelled = cancel.structured_content or {}
            assert cancelled["cancel_accepted"] is True
            assert text_of(cancel).startswith(f"cancel accepted: run {cancelled['id']} is ")
            assert cancelled["status"] in ("cancelled", "running")
            ended = await call(mcp, "watch_run", run_id=cancelled["id"], timeout_seconds=30)
            assert ended["run"]["status"] == "cancelled"
            # Like every tool that starts or changes a run, cancel_run can wait for the end.
            started = await call(mcp, "run_worker", worker="sleepy")
            run_id = started["run"]["id"]
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
                )
            )
            waited = await call_raw(mcp, "cancel_run", run_id=run_id, wait_seconds=30)
            stopped = waited.structured_content or {}
            assert (stopped["status"], stopped["finished"]) == ("cancelled", True)
            assert text_of(waited).startswith(f"cancel accepted: run {run_id} is cancelled")

    anyio.run(session)


def test_a_handshake_era_client_works_over_http_and_hears_of_new_tools(
    server: LiveServer,
) -> None:
    notices: list[str] = []

    async def on_message(message: object) -> None:
        if method := getattr(message, "method", None):
            notices.append(method)

    async def session() -> None:
        async with http_client(server, mode="legacy", message_handler=on_message) as mcp:
            assert mcp.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            assert (await call(mcp, "list_workers"))["items"] == []
            await call(mcp, "deploy_worker", files={"worker.yml": SHOUT_YML, "run.py": SHOUT_PY})
            with anyio.fail_after(CALL_TIMEOUT):
                while "notifications/tools/list_changed" not in notices:
                    await anyio.sleep(0.05)
            assert (await call(mcp, "shout", text="ok"))["outputs"] == {"shouted": "OK"}

    anyio.run(session)


def test_the_tools_answer_with_the_bodies_rest_answers_for_the_same_entities(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    everywhere = SHOUT_YML.replace("expose: [mcp]\n", "")  # REST starts the run
    deploy_folder(api, make_worker(tmp_path / "shout", everywhere, {"run.py": SHOUT_PY}))
    deploy_folder(api, make_worker(tmp_path / "nightly", SCHEDULED_YML, {"run.sh": "echo hi\n"}))
    run_id = api.post("/api/v1/workers/shout/runs", json={"inputs": {"text": "hi"}}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"
    api.put("/api/v1/secrets/SHOUT_TOKEN", json={"value": "value-1234"})
    with session_scope(server.ctx.engine, write=True) as s:
        s.add(Approval(id="apr_1", run_id=run_id, worker_name="shout", kind=ApprovalKind.RUN))
    rest = {
        "list_runs": api.get("/api/v1/runs", params={"worker": "shout", "limit": 20}),
        "list_versions": api.get("/api/v1/workers/shout/versions"),
        "list_triggers": api.get("/api/v1/workers/nightly/triggers"),
        "list_secrets": api.get("/api/v1/secrets"),
        "list_approvals": api.get("/api/v1/approvals", params={"worker": "shout"}),
    }
    arguments: dict[str, dict[str, Any]] = {
        "list_runs": {"worker": "shout"},
        "list_versions": {"worker": "shout"},
        "list_triggers": {"worker": "nightly"},
        "list_approvals": {"worker": "shout"},
    }

    async def session() -> dict[str, dict[str, Any]]:
        async with http_client(server) as mcp:
            return {tool: await call(mcp, tool, **arguments.get(tool, {})) for tool in rest}

    answered = anyio.run(session)
    # One public model per entity: /mcp's structured content is REST's body, field for field.
    for tool, response in rest.items():
        assert response.status_code == 200, (tool, response.text)
        assert response.json()["items"], tool
        assert answered[tool] == response.json(), tool


def test_approvals_are_listed_a_page_at_a_time_each_saying_what_it_waits_for(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    everywhere = SHOUT_YML.replace("expose: [mcp]\n", "")
    deploy_folder(api, make_worker(tmp_path / "shout", everywhere, {"run.py": SHOUT_PY}))
    run_id = api.post("/api/v1/workers/shout/runs", json={"inputs": {"text": "hi"}}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"
    with session_scope(server.ctx.engine, write=True) as s:
        for n in range(3):
            proposed = json.dumps({"title": f"draft {n}"})
            s.add(
                Approval(
                    id=f"apr_{n}",
                    run_id=run_id,
                    worker_name="shout",
                    kind=ApprovalKind.RUN,
                    proposed_json=proposed,
                )
            )

    async def session() -> None:
        async with http_client(server) as mcp:
            first = await call_raw(mcp, "list_approvals", limit=2)
            page = first.structured_content or {}
            assert [a["id"] for a in page["items"]] == ["apr_0", "apr_1"]
            assert page["next_cursor"]
            assert f"apr_0  shout  run {run_id}  run  pending" in text_of(first)
            assert 'proposes {"title": "draft 0"}' in text_of(first)
            assert f"cursor={page['next_cursor']}" in text_of(first)
            rest = await call(mcp, "list_approvals", limit=2, cursor=page["next_cursor"])
            assert [a["id"] for a in rest["items"]] == ["apr_2"]
            assert rest["next_cursor"] is None

    anyio.run(session)


def test_a_worker_whose_secret_is_not_set_says_so_and_how_to_turn_its_schedule_on(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # As a fresh install leaves an example: a declared secret not set, its schedule paused.
    manifest = 'name: needy\nsecrets: [NEEDY_TOKEN]\ntriggers:\n  - schedule: {cron: "0 3 * * *"}\n'
    deploy_folder(api, make_worker(tmp_path / "needy", manifest, {"run.sh": "echo hi\n"}))
    (trigger,) = api.get("/api/v1/workers/needy/triggers").json()["items"]
    paused = api.post("/api/v1/workers/needy/pause", json={"trigger_id": trigger["id"]})
    assert paused.status_code == 200, paused.text
    assert api.get("/api/v1/workers/needy").json()["secrets_missing"] == ["NEEDY_TOKEN"]
    # Which secrets are set is the deploy scope's to know, as their names are.
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    with server.client(read_key) as reader:
        assert "secrets_missing" not in reader.get("/api/v1/workers/needy").json()

    async def session() -> None:
        async with http_client(server) as mcp:
            told = await call_raw(mcp, "get_worker", worker="needy")
            assert (told.structured_content or {})["secrets_missing"] == ["NEEDY_TOKEN"]
            assert "set_secret(name='NEEDY_TOKEN', value=VALUE)" in text_of(told)
            assert f"resume_worker(worker='needy', trigger='{trigger['id']}')" in text_of(told)

    anyio.run(session)
    web = signed_in_client(server, server.admin_key)
    try:
        page = web.get("/workers/needy").text
        assert re.search(r'id="secrets-missing"><strong>Not set:</strong> NEEDY_TOKEN\.', page)
        assert 'on the <a href="/secrets">Secrets page</a>, then resume its paused' in page
        set_it = api.put("/api/v1/secrets/NEEDY_TOKEN", json={"value": "value-1234"})
        assert set_it.status_code == 200, set_it.text
        assert api.get("/api/v1/workers/needy").json()["secrets_missing"] == []
        assert 'id="secrets-missing"' not in web.get("/workers/needy").text
    finally:
        web.close()


TICKER_PY = """\
import time
for i in range(1, 6):
    print(f"tick {i}", flush=True)
    time.sleep(0.4)
"""


def test_watch_run_sends_progress_to_a_client_that_asks_for_it(
    server: LiveServer, api: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Progress every 0.5 s instead of 2 s: a 2 s run is then heard several times, as a 6 s one
    # was at the real interval.
    monkeypatch.setattr(mcp_core, "PROGRESS_EVERY_SECONDS", 0.5)
    deploy_folder(api, make_worker(tmp_path / "ticker", "name: ticker\n", {"run.py": TICKER_PY}))
    run_id = api.post("/api/v1/workers/ticker/runs", json={}).json()["id"]
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, total, message))

    async def over_mcp() -> dict[str, Any]:
        async with http_client(server) as mcp:
            with anyio.fail_after(CALL_TIMEOUT):
                result = await mcp.call_tool(
                    "watch_run",
                    {"run_id": run_id, "timeout_seconds": 30},
                    progress_callback=progress,
                )
            assert not result.is_error, text_of(result)
            return result.structured_content or {}

    watched = anyio.run(over_mcp)

    assert watched["finished"] is True
    assert watched["run"]["status"] == "succeeded"
    assert len(heard) >= 2, heard
    values = [v for v, _, _ in heard]
    assert values == sorted(values)
    assert all(total == 30 for _, total, _ in heard)
    assert all(f"run {run_id} is running" in (m or "") for _, _, m in heard)
    assert any("last log line: tick" in (m or "") for _, _, m in heard), heard


def test_deploy_worker_leaves_environment_files_sent_as_files_out_and_says_so(
    server: LiveServer, api: httpx.Client
) -> None:
    # Before: `files={".env": ...}` shipped the file into the version, readable by any read
    # key and in every run's sandbox, and the reply said nothing.
    files = {
        "worker.yml": "name: dotenv\n",
        "run.py": "print('hi')\n",
        ".env": "TOKEN=sk-live\n",
        "conf/.env.production": "TOKEN=x\n",
        ".env.example": "TOKEN=\n",
    }

    async def session() -> None:
        async with http_client(server) as mcp:
            for tool in ("validate_worker", "deploy_worker"):
                result = await call_raw(mcp, tool, files=files)
                assert not result.is_error, text_of(result)
                said = text_of(result)
                assert "left out '.env' (an environment file: store its secrets with" in said
                assert "set_secret(" in said
                assert "left out 'conf/.env.production' (an environment file" in said
                left_out = (result.structured_content or {})["left_out"]
                assert [why.split(" ", 1)[0] for why in left_out] == [
                    "'.env'",
                    "'conf/.env.production'",
                ]

    anyio.run(session)
    version = api.get("/api/v1/workers/dotenv").json()["active_version_id"]
    shipped = api.get(f"/api/v1/workers/dotenv/versions/{version}").json()["files"]
    assert sorted(f["path"] for f in shipped) == [".env.example", "run.py", "worker.yml"]
