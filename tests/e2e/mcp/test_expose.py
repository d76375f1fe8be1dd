"""worker.yml's `expose` decides which surfaces may start a worker (REST and the CLI, MCP,
the web UI; all when it is absent), each refusal a 403 `not_exposed` that names the allowed
surfaces and creates no run; triggers start the worker whatever it says."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlmodel import select
from standardwebhooks.webhooks import Webhook

from floom.errors import NotExposed
from floom.services.access.principal import SYSTEM, Principal
from floom.services.runs import lifecycle as runs
from floom.store.db import session_scope
from floom.store.replays import Eval
from floom.vocabulary import RunTrigger
from tests.standins.anthropic_api import reply, tool_use
from tests.support.cli import cli
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.mcp_clients import call, call_error, http_client
from tests.support.rigs.agents import agent_rig, agent_worker, start_run, wait_status
from tests.support.web import csrf_of, signed_in_client

ECHO_PY = """\
import json
inputs = json.load(open("inputs.json"))
json.dump({"outputs": {"got": inputs.get("word")}}, open("result.json", "w"))
"""
HOOK_SECRET = "whsec_" + "ZXhwb3NlLXRlc3RzLXNlY3JldC0xMjM0NTY3ODkw"
# The rule lives in the service every surface calls; one database is enough to walk it.
ONE_DATABASE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _deploy(api: httpx.Client, tmp_path: Path, name: str, expose: str | None) -> None:
    manifest = f"name: {name}\ninputs:\n  word: {{type: string, default: hi}}\n"
    if expose is not None:
        manifest += f"expose: {expose}\n"
    deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": ECHO_PY}))


def _runs_of(api: httpx.Client, worker: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get("/api/v1/runs", params={"worker": worker}).json()["items"]
    return items


@ONE_DATABASE
def test_rest_and_the_cli_start_only_workers_that_expose_rest(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, "open", None)
    _deploy(api, tmp_path, "restful", "[rest]")
    _deploy(api, tmp_path, "agentic", "[mcp, ui]")
    for name in ("open", "restful"):
        resp = api.post(f"/api/v1/workers/{name}/runs", json={})
        assert resp.status_code == 202, resp.text
        assert wait_for_run(api, resp.json()["id"])["status"] == "succeeded"

    refused = api.post("/api/v1/workers/agentic/runs", json={})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "not_exposed"
    assert "the REST API" in error["message"]
    assert "mcp, ui only" in error["message"]
    assert error["details"] == {"surface": "rest", "allowed": ["mcp", "ui"]}
    assert "add rest to `expose`" in error["hint"]
    assert "expose: [mcp, ui, rest]" in error["hint"]
    assert "POST /api/v1/workers" in error["hint"]  # a plain REST client may have no CLI
    # The CLI is a client of the REST API: it counts as rest, and says it is the CLI.
    cli = api.post(
        "/api/v1/workers/agentic/runs", json={}, headers={"X-Floom-Client": "cli"}
    ).json()["error"]
    assert cli["code"] == "not_exposed"
    assert "the CLI" in cli["message"]
    assert "`floom deploy`" in cli["hint"]
    assert cli["details"]["surface"] == "rest"
    assert (
        api.post(
            "/api/v1/workers/restful/runs", json={}, headers={"X-Floom-Client": "cli"}
        ).status_code
        == 202
    )
    assert _runs_of(api, "agentic") == []

    # A replay is a start too: refused the same way once expose leaves the surface out.
    first = _runs_of(api, "restful")[-1]["id"]
    _deploy(api, tmp_path, "restful", "[ui]")
    replay = api.post(f"/api/v1/runs/{first}/replay", json={})
    assert replay.status_code == 403
    assert replay.json()["error"]["code"] == "not_exposed"
    assert len(_runs_of(api, "restful")) == 2


@ONE_DATABASE
def test_an_mcp_client_starts_only_workers_that_expose_mcp(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, "open", None)
    _deploy(api, tmp_path, "agentic", "[mcp]")
    _deploy(api, tmp_path, "humane", "[ui, rest]")

    async def session() -> None:
        async with http_client(server) as mcp:
            for name in ("open", "agentic"):
                ran = await call(mcp, "run_worker", worker=name, wait_seconds=30)
                assert ran["run"]["status"] == "succeeded", name
            assert (await call(mcp, "agentic", word="own tool"))["outputs"] == {"got": "own tool"}
            refused = await call_error(mcp, "run_worker", worker="humane")
            assert refused["code"] == "not_exposed"
            assert "from MCP" in refused["message"]
            assert "ui, rest only" in refused["message"]
            # Retold for an agent: the tool that deploys, not a CLI command.
            assert "add mcp to `expose`" in refused["hint"]
            assert "deploy_worker" in refused["hint"]
            assert "`floom" not in refused["hint"]
            ran = api.post("/api/v1/workers/humane/runs", json={}).json()
            wait_for_run(api, ran["id"])
            refused = await call_error(mcp, "replay_run", run_id=ran["id"])
            assert refused["code"] == "not_exposed"

    anyio.run(session)
    assert len(_runs_of(api, "humane")) == 1


@ONE_DATABASE
def test_the_web_ui_starts_only_workers_that_expose_ui(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, "clicky", "[ui]")
    _deploy(api, tmp_path, "headless", "[rest, mcp]")
    browser = signed_in_client(server, server.admin_key)

    page = browser.get("/workers/clicky").text
    started = browser.post("/workers/clicky/runs", data={"csrf": csrf_of(page), "word": "yo"})
    assert started.status_code == 303
    assert started.headers["location"].startswith("/runs/run_")

    page = browser.get("/workers/headless").text
    # The page says why there is no run form, and what to change.
    assert 'action="/workers/headless/runs"' not in page
    assert "exposes it to <b>rest, mcp</b> only" in page
    refused = browser.post("/workers/headless/runs", data={"csrf": csrf_of(page), "word": "yo"})
    assert refused.status_code == 403
    assert "cannot be started from the web UI" in refused.text
    assert "add ui to" in refused.text
    assert _runs_of(api, "headless") == []
    assert len(_runs_of(api, "clicky")) == 1


@ONE_DATABASE
def test_triggers_start_a_worker_whatever_expose_says(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    api.put("/api/v1/secrets/EXPOSE_HOOK_SECRET", json={"value": HOOK_SECRET})
    manifest = (
        "name: hooked\ninputs: {word: {type: string, default: hi}}\nexpose: [mcp]\n"
        "triggers:\n  - webhook: {secret: EXPOSE_HOOK_SECRET, inputs: {word: word}}\n"
    )
    deploy_folder(api, make_worker(tmp_path / "hooked", manifest, {"run.py": ECHO_PY}))
    body = json.dumps({"word": "pushed"}).encode()
    now = datetime.now(UTC)
    headers = {
        "webhook-id": "msg_expose_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(HOOK_SECRET).sign("msg_expose_1", now, body.decode()),
        "content-type": "application/json",
    }
    with httpx.Client(base_url=server.base_url, timeout=60) as anonymous:
        delivered = anonymous.post("/hooks/hooked", content=body, headers=headers)
    assert delivered.status_code == 202, delivered.text
    run = wait_for_run(api, delivered.json()["run_id"])
    assert run["status"] == "succeeded"
    assert run["trigger"] == "webhook"
    assert run["outputs"] == {"got": "pushed"}
    # Replaying the delivery is a person's start, though: held to expose like any replay,
    # through REST, the CLI and the web UI's replay of its run.
    delivery = delivered.json()["delivery_id"]
    refused = api.post(f"/api/v1/deliveries/{delivery}/replay", json={})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["details"] == {"surface": "rest", "allowed": ["mcp"]}
    done = cli(server, "replay-delivery", delivery)
    assert done.returncode != 0
    assert "cannot be started from the CLI" in done.stdout + done.stderr
    browser = signed_in_client(server, server.admin_key)
    page = browser.get(f"/runs/{run['id']}").text
    replayed = browser.post(f"/runs/{run['id']}/replay", data={"csrf": csrf_of(page)})
    assert replayed.status_code == 403
    assert "cannot be started from the web UI" in replayed.text
    assert len(_runs_of(api, "hooked")) == 1
    # floom itself (a schedule fire, an agent's call) is never a surface.
    scheduled = runs.create_run(
        server.ctx, worker_name="hooked", trigger=RunTrigger.SCHEDULE, caller=SYSTEM
    )
    # Accepted: queued, or already started by the server's executor with a slot free.
    assert scheduled.status in ("queued", "running")


@ONE_DATABASE
def test_a_replay_from_a_recording_acts_on_nothing_and_is_not_a_surface_start(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    _deploy(api, tmp_path, "agentic", "[mcp]")
    key = api.get("/api/v1/keys/me").json()
    cli = Principal(key_id=key["id"], name="cli", scopes=("admin",), surface="cli")
    with pytest.raises(NotExposed):
        runs.create_run(server.ctx, worker_name="agentic", trigger=RunTrigger.REPLAY, caller=cli)
    replay = runs.create_run(
        server.ctx,
        worker_name="agentic",
        trigger=RunTrigger.REPLAY,
        caller=cli,
        from_recording=True,
    )
    assert replay.created_by == key["id"]


AGENT_YML = """\
name: sage
outputs:
  summary: string
tools:
  - builtin: http_request
    name: fetch
    allow_domains: [api.example.test]
{extra}"""


@ONE_DATABASE
def test_a_what_if_replay_or_eval_that_may_call_tools_live_is_a_start_expose_decides(
    tmp_path: Path, database_url: str
) -> None:
    """A replay from a recording acts on nothing and any surface may start it; one whose
    version may call tools live (replay.live_tools) acts as a run does, so `expose` decides
    it on every surface, as it does an eval of such replays. Before, each was queued (202)
    from REST, the CLI and the web UI for a worker exposed to MCP only."""
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as rig:
        rig.deploy(agent_worker(tmp_path / "v1", AGENT_YML.format(extra="")))
        rig.model.script(reply(tool_use("finish", {"outputs": {"summary": "done"}})))
        run_id = start_run(rig.api, "sage")
        assert wait_status(rig.api, run_id)["status"] == "succeeded"
        live = "expose: [mcp]\nreplay:\n  live_tools: [fetch]\n"
        rig.deploy(agent_worker(tmp_path / "v2", AGENT_YML.format(extra=live)))
        url = f"/api/v1/runs/{run_id}/replays"
        evals_url = "/api/v1/workers/sage/evals"
        before = len(_runs_of(rig.api, "sage"))

        refused = rig.api.post(url, json={"mode": "what_if"})
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "not_exposed"
        assert error["details"] == {"surface": "rest", "allowed": ["mcp"]}
        refused = rig.api.post(evals_url, json={"runs": f"ids:{run_id}"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "not_exposed"
        with session_scope(rig.server.ctx.engine) as s:
            assert s.exec(select(Eval)).all() == []  # refused before its row was written

        done = cli(rig.server, "replay", run_id, "--model", "claude-other")
        assert done.returncode != 0
        assert "cannot be started from the CLI" in done.stdout + done.stderr
        done = cli(rig.server, "eval", "sage", "--runs", f"ids:{run_id}")
        assert done.returncode != 0
        assert "cannot be started from the CLI" in done.stdout + done.stderr

        browser = signed_in_client(rig.server, rig.server.admin_key)
        page = browser.get(f"/runs/{run_id}").text
        form = {"csrf": csrf_of(page), "mode": "what_if"}
        refused = browser.post(f"/runs/{run_id}/replays", data=form)
        assert refused.status_code == 403
        assert "cannot be started from the web UI" in refused.text
        form = {"csrf": csrf_of(page), "runs": f"ids:{run_id}"}
        refused = browser.post("/workers/sage/evals", data=form)
        assert refused.status_code == 403
        assert "cannot be started from the web UI" in refused.text
        assert len(_runs_of(rig.api, "sage")) == before

        # Acting on nothing stays open to every surface: an exact replay of the recording.
        assert rig.api.post(url, json={"mode": "exact"}).status_code == 202
        # MCP, which the worker exposes, starts the live one.
        rig.model.script(reply(tool_use("finish", {"outputs": {"summary": "again"}})))

        async def session() -> None:
            async with http_client(rig.server) as mcp:
                done = await call(
                    mcp, "replay_recorded_run", run_id=run_id, mode="what_if", wait_seconds=30
                )
                assert done["status"] == "succeeded", done

        anyio.run(session)
