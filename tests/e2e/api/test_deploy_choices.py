"""Which code runs, and whether a paused worker runs at all, are a deploy key's decisions: a
run key starts the active version of a worker that is not paused. A run pinned to another
version, a replay of a run on a version no longer active, and a forced run of a paused
worker need the deploy scope, on every surface (the rule is in the service), and the
decision is made again inside the transaction that queues the run. So does a replay of a
webhook delivery its paused trigger held back, or of any delivery while its trigger is
paused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlmodel import select

from floom.errors import Forbidden
from floom.services.access import keys
from floom.services.access.principal import SYSTEM, Principal
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.triggers import registry, webhooks
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.replays import Eval
from tests.e2e.api.test_triggers_webhooks import hook, setup_standard, standard_headers
from tests.standins.anthropic_api import reply, tool_use
from tests.support.cli import cli
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.mcp_clients import http_client
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status
from tests.support.web import csrf_of, signed_in_client


def _two_versions(api: httpx.Client, tmp_path: Path) -> tuple[str, str]:
    """A worker `chosen` deployed twice: (the older version, the active one)."""
    old = deploy_folder(api, make_worker(tmp_path / "a", "name: chosen\n", {"run.py": "1\n"}))
    new = deploy_folder(api, make_worker(tmp_path / "b", "name: chosen\n", {"run.py": "2\n"}))
    return old["version"]["id"], new["version"]["id"]


def _key(server: LiveServer, scope: str) -> httpx.Client:
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=[scope], name=f"a {scope} key")
    return server.client(key=token)


def _refusal(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 403, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["code"] == "forbidden"
    assert error["details"]["scope_needed"] == "deploy"
    return error


def test_a_run_key_runs_the_active_version_and_only_a_deploy_key_pins_another(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        old, active = _two_versions(admin, tmp_path)
    run_key, deploy_key = _key(server, "run"), _key(server, "deploy")
    url = "/api/v1/workers/chosen/runs"

    error = _refusal(run_key.post(url, json={"version_id": old}))
    assert old in error["message"]
    assert active in error["message"]
    assert "rollback" in error["hint"]
    # The active version, named or not, is the run key's to start.
    assert run_key.post(url, json={"version_id": active}).status_code == 202
    assert run_key.post(url, json={}).status_code == 202
    pinned = deploy_key.post(url, json={"version_id": old})
    assert pinned.status_code == 202, pinned.text
    assert pinned.json()["version_id"] == old


def test_a_run_key_replays_a_run_of_an_older_version_only_on_the_active_one(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        old, active = _two_versions(admin, tmp_path)
        first = admin.post("/api/v1/workers/chosen/runs", json={"version_id": old}).json()
        wait_for_run(admin, first["id"])
    run_key, deploy_key = _key(server, "run"), _key(server, "deploy")
    url = f"/api/v1/runs/{first['id']}/replay"

    error = _refusal(run_key.post(url, json={}))
    assert "replay" in error["message"]
    assert '"latest": true' in error["hint"]  # the REST client is told the request to send
    latest = run_key.post(url, json={"latest": True})
    assert latest.status_code == 202, latest.text
    assert latest.json()["version_id"] == active
    again = deploy_key.post(url, json={})
    assert again.status_code == 202, again.text
    assert again.json()["version_id"] == old


def test_a_replay_on_the_version_still_active_needs_only_the_run_scope(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        _, active = _two_versions(admin, tmp_path)
        first = admin.post("/api/v1/workers/chosen/runs", json={}).json()
        wait_for_run(admin, first["id"])
    again = _key(server, "run").post(f"/api/v1/runs/{first['id']}/replay", json={})
    assert again.status_code == 202, again.text
    assert again.json()["version_id"] == active


def test_only_a_deploy_key_forces_a_run_of_a_paused_worker(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        _two_versions(admin, tmp_path)
        assert admin.post("/api/v1/workers/chosen/pause").status_code == 200
    run_key, deploy_key = _key(server, "run"), _key(server, "deploy")
    url = "/api/v1/workers/chosen/runs"

    paused = run_key.post(url, json={})
    assert paused.status_code == 409
    assert paused.json()["error"]["code"] == "worker_paused"
    error = _refusal(run_key.post(url, json={"force": True}))
    assert "paused" in error["message"]
    assert deploy_key.post(url, json={"force": True}).status_code == 202
    # A replay with force is the same choice.
    forced = deploy_key.post(url, json={"force": True}).json()
    _refusal(run_key.post(f"/api/v1/runs/{forced['id']}/replay", json={"force": True}))


def test_mcp_run_tool_refuses_a_run_key_forcing_a_paused_worker(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        _two_versions(admin, tmp_path)
        assert admin.post("/api/v1/workers/chosen/pause").status_code == 200
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="mcp run key")

    async def call() -> dict[str, Any]:
        async with http_client(server, token) as mcp:
            result = await mcp.call_tool("run_worker", {"worker": "chosen", "force": True})
            return dict(result.structured_content or {})

    error = anyio.run(call)["error"]
    assert error["code"] == "forbidden"
    assert "resume_worker" in error["hint"]  # told as an MCP tool call


def test_a_rollback_between_the_check_and_the_queueing_is_seen_in_the_transaction(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = server.ctx
    with server.client() as admin:
        old, active = _two_versions(admin, tmp_path)
    run_key, _ = keys.create_key(ctx, caller=SYSTEM, scopes=["run"], name="racing run key")
    caller = Principal.of_key(run_key)
    checked = agent_runs.check_monthly_cap

    # Between each pass's checks and its queueing transaction, a deploy key switches the
    # active version: the first pass (from this process's copy) sees its copy is stale and
    # reads again; the second decides on the version it read, and the switch lands after.
    def switch_then_check(ctx_: Any, **kwargs: Any) -> None:
        now = workers.get_worker(ctx, name="chosen", caller=SYSTEM).active_version_id
        target = old if now == active else active
        workers.rollback(ctx, name="chosen", version_id=target, caller=SYSTEM)
        checked(ctx_, **kwargs)

    monkeypatch.setattr(agent_runs, "check_monthly_cap", switch_then_check)
    with pytest.raises(Forbidden) as refused:
        runs.create_run(ctx, worker_name="chosen", caller=caller)
    assert refused.value.details["scope_needed"] == "deploy"
    with server.client() as admin:
        listed = admin.get("/api/v1/runs", params={"worker": "chosen"}).json()
    assert listed["items"] == []


def test_the_cli_and_the_web_ui_are_told_the_same_refusal(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        old, _ = _two_versions(admin, tmp_path)
        first = admin.post("/api/v1/workers/chosen/runs", json={"version_id": old}).json()
        wait_for_run(admin, first["id"])
        assert admin.post("/api/v1/workers/chosen/pause").status_code == 200
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="a person")

    forced = cli(server, "run", "chosen", "--force", key=token)
    assert forced.returncode != 0
    assert "'deploy' scope" in forced.stderr + forced.stdout
    replayed = cli(server, "replay", first["id"], key=token)
    assert replayed.returncode != 0
    assert f"floom replay {first['id']} --latest" in replayed.stderr + replayed.stdout

    browser = signed_in_client(server, token)
    page = browser.get(f"/runs/{first['id']}")
    resp = browser.post(f"/runs/{first['id']}/replay", data={"csrf": csrf_of(page.text)})
    assert resp.status_code == 403
    assert "Replay on the active version" in resp.text  # the UI names its own button


def test_a_run_key_does_not_replay_a_delivery_its_paused_trigger_held_back(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as admin:
        setup_standard(admin, tmp_path)
        (trigger,) = admin.get("/api/v1/workers/std/triggers").json()["items"]
        body = b'{"n": 1}'
        ran = hook(server, "/hooks/std", body, standard_headers(body, "msg_ran")).json()
        wait_for_run(admin, ran["run_id"])
        admin.post("/api/v1/workers/std/pause", json={"trigger_id": trigger["id"]})
        body = b'{"n": 2}'
        held = hook(server, "/hooks/std", body, standard_headers(body, "msg_held")).json()
        assert held["outcome"] == "paused"
    run_key, deploy_key = _key(server, "run"), _key(server, "deploy")

    def replay(key: httpx.Client, delivery: dict[str, Any]) -> httpx.Response:
        return key.post(f"/api/v1/deliveries/{delivery['delivery_id']}/replay", json={})

    # While the trigger is paused, no delivery of it is the run key's to run.
    for delivery in (ran, held):
        error = _refusal(replay(run_key, delivery))
        assert delivery["delivery_id"] in error["message"]
        assert "resume" in error["hint"]
    with server.client() as admin:
        admin.post("/api/v1/workers/std/resume", json={"trigger_id": trigger["id"]})
    # Resumed: what ran may run again; what the pause held back stays a deploy decision.
    assert replay(run_key, ran).status_code == 202
    error = _refusal(replay(run_key, held))
    assert "came while its trigger or worker was paused" in error["message"]
    replayed = replay(deploy_key, held)
    assert replayed.status_code == 202, replayed.text
    with server.client() as admin:
        assert wait_for_run(admin, replayed.json()["id"])["outputs"]["event"] == {"n": 2}


def test_a_pause_between_the_replay_s_check_and_its_queueing_is_seen_in_the_transaction(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = server.ctx
    with server.client() as admin:
        setup_standard(admin, tmp_path)
        (trigger,) = admin.get("/api/v1/workers/std/triggers").json()["items"]
        body = b'{"n": 1}'
        ran = hook(server, "/hooks/std", body, standard_headers(body, "msg_race")).json()
        wait_for_run(admin, ran["run_id"])
    run_key, _ = keys.create_key(ctx, caller=SYSTEM, scopes=["run"], name="racing run key")
    inputs_of = webhooks.event_inputs

    def pause_then_read(ctx_: Any, **kwargs: Any) -> Any:
        registry.set_paused(
            ctx, worker_name="std", paused=True, trigger_id=trigger["id"], caller=SYSTEM
        )
        return inputs_of(ctx_, **kwargs)

    monkeypatch.setattr(webhooks, "event_inputs", pause_then_read)
    with pytest.raises(Forbidden) as refused:
        webhooks.replay_delivery(
            ctx, delivery_id=ran["delivery_id"], caller=Principal.of_key(run_key)
        )
    assert refused.value.details["scope_needed"] == "deploy"
    with server.client() as admin:
        listed = admin.get("/api/v1/runs", params={"worker": "std"}).json()
    assert [run["id"] for run in listed["items"]] == [ran["run_id"]]


SAGE_YML = """\
name: sage
outputs:
  summary: string
tools:
  - builtin: http_request
    name: fetch
    allow_domains: [api.example.test]
{replay}"""


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as r:
        yield r


def test_a_what_if_replay_that_may_call_tools_live_is_a_deploy_choice_off_the_active_version(
    rig: AgentRig, tmp_path: Path
) -> None:
    """A replay from a recording acts on nothing, unless its version lists replay.live_tools:
    then a run key picking an older version (or a paused worker) would make that version act,
    as pinning it for a run would. Before, both were queued (202) for a run key."""
    live = "replay:\n  live_tools: [fetch]\n"
    older = agent_worker(tmp_path / "old", SAGE_YML.format(replay=live), skill="Old ways.")
    old = deploy_folder(rig.api, older)["version"]["id"]
    rig.deploy(agent_worker(tmp_path / "new", SAGE_YML.format(replay=""), skill="New ways."))
    rig.model.script(reply(tool_use("finish", {"outputs": {"summary": "done"}})))
    run_id = start_run(rig.api, "sage")
    assert wait_status(rig.api, run_id)["status"] == "succeeded"
    run_key = _key(rig.server, "run")
    url = f"/api/v1/runs/{run_id}/replays"

    error = _refusal(run_key.post(url, json={"mode": "what_if", "version_id": old}))
    assert "live" in error["message"]
    assert "leave the version out" in error["hint"]
    # Acting on nothing stays a run key's: exactly, or what-if on the active version.
    assert run_key.post(url, json={"mode": "exact"}).status_code == 202
    assert run_key.post(url, json={"mode": "what_if"}).status_code == 202
    evals = "/api/v1/workers/sage/evals"
    _refusal(run_key.post(evals, json={"runs": f"ids:{run_id}", "version_id": old}))
    with session_scope(rig.server.ctx.engine) as s:
        assert s.exec(select(Eval)).all() == []  # refused before anything was written
    assert _deploy_key(rig).post(url, json={"mode": "what_if", "version_id": old}).is_success

    # With that version active again but the worker paused, a live replay is still one.
    assert rig.api.post("/api/v1/workers/sage/rollback", json={"version_id": old}).is_success
    assert rig.api.post("/api/v1/workers/sage/pause").is_success
    error = _refusal(run_key.post(url, json={"mode": "what_if"}))
    assert "paused" in error["message"]
    assert run_key.post(url, json={"mode": "exact"}).status_code == 202


def _deploy_key(rig: AgentRig) -> httpx.Client:
    return _key(rig.server, "deploy")
