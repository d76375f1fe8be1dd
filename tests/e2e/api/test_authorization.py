"""Every REST route and every MCP tool is walked with no key and with each scope, from the
app's own route table, its OpenAPI document and the MCP tool list, so a new route or tool
cannot skip authorization; and every service that takes a caller is called with a caller
holding no scope, so the rule holds below the surfaces too."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
from fastapi.routing import APIRoute

import floom.services
from floom.errors import Forbidden
from floom.mcp.tools import core as mcp_tools
from floom.services.access.principal import SCOPES, Principal, grants
from floom.services.context import Context
from tests.support.harness import LiveServer, deploy_folder, make_worker, plain_client
from tests.support.mcp_clients import http_client
from tests.support.rigs.handoffs import agent_keys_by_scope

API = "/api/v1"
# Routes under /api/v1 that answer without a key, and why.
PUBLIC: dict[tuple[str, str], str] = {}


def _scope_of(route: APIRoute) -> str | None:
    """The scope a route's dependencies require (None: no key dependency at all)."""
    pending = list(route.dependant.dependencies)
    while pending:
        dep = pending.pop()
        scope = getattr(dep.call, "scope", None)
        if scope is not None:
            return str(scope)
        pending.extend(dep.dependencies)
    return None


def _api_routes(server: LiveServer) -> list[tuple[str, str, str | None]]:
    from floom.api.app import create_app

    app = create_app(ctx=server.ctx)
    found = []
    pending: list[Any] = list(app.routes)
    while pending:
        route = pending.pop()
        # Included routers are wrapped (FastAPI 0.16x includes them lazily); walk into them.
        inner = getattr(route, "original_router", None)
        if inner is not None:
            pending.extend(inner.routes)
            continue
        if not isinstance(route, APIRoute) or not route.path.startswith(API):
            continue
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            path = route.path.replace(":path}", "}")  # as the OpenAPI document spells it
            found.append((method, path, _scope_of(route)))
    assert found, "no /api/v1 route found: the walk no longer sees the app's routes"
    return found


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "nope-0", path)


def test_every_api_route_declares_a_scope(server: LiveServer) -> None:
    missing = [
        (method, path)
        for method, path, scope in _api_routes(server)
        if scope is None and (method, path) not in PUBLIC
    ]
    assert missing == []


# Every /api/v1 route and the scope it needs, written out. A new route fails the test below
# until it is added here with the scope its author chose, and a route whose scope changes
# fails it too: either is then a decision someone wrote down, not a default. Reads are
# `read`; starting, cancelling, replaying and deciding runs and handoff work `run`; what
# changes code, its triggers, state, secrets or alerts `deploy`; keys, agents, roles and the
# audit trail `admin`.
ROUTE_SCOPES: dict[str, str] = {
    "GET /api/v1/agents": "read",
    "POST /api/v1/agents": "admin",
    "GET /api/v1/agents/me": "read",
    "GET /api/v1/agents/{agent}": "read",
    "PATCH /api/v1/agents/{agent}": "admin",
    "POST /api/v1/agents/{agent}/keys": "admin",
    "POST /api/v1/agents/{agent}/retire": "admin",
    "GET /api/v1/alerts/callback-key": "admin",
    "GET /api/v1/alerts/channels": "read",
    "POST /api/v1/alerts/channels": "deploy",
    "DELETE /api/v1/alerts/channels/{name}": "deploy",
    "PATCH /api/v1/alerts/channels/{name}": "deploy",
    "PUT /api/v1/alerts/channels/{name}": "deploy",
    "POST /api/v1/alerts/channels/{name}/test": "deploy",
    "GET /api/v1/alerts/deliveries": "read",
    "GET /api/v1/alerts/deliveries/{alert_delivery_id}": "read",
    "POST /api/v1/alerts/deliveries/{alert_delivery_id}/resend": "deploy",
    "GET /api/v1/alerts/rules": "read",
    "POST /api/v1/alerts/rules": "deploy",
    "DELETE /api/v1/alerts/rules/{name}": "deploy",
    "PATCH /api/v1/alerts/rules/{name}": "deploy",
    "GET /api/v1/approvals": "read",
    "GET /api/v1/approvals/{approval_id}": "read",
    # Editing a call's arguments needs deploy too, decided in the service.
    "POST /api/v1/approvals/{approval_id}/approve": "run",
    "POST /api/v1/approvals/{approval_id}/reject": "run",
    "GET /api/v1/audit": "admin",
    "GET /api/v1/deliveries/{delivery_id}": "read",
    "POST /api/v1/deliveries/{delivery_id}/replay": "run",
    "GET /api/v1/evals/{eval_id}": "read",
    "POST /api/v1/handoffs/claim-next": "run",
    "GET /api/v1/handoffs/jobs": "read",
    "POST /api/v1/handoffs/jobs": "run",
    "GET /api/v1/handoffs/jobs/{job_id}": "read",
    "PATCH /api/v1/handoffs/jobs/{job_id}": "run",
    "POST /api/v1/handoffs/jobs/{job_id}/claim": "run",
    "POST /api/v1/handoffs/jobs/{job_id}/complete": "run",
    "GET /api/v1/handoffs/jobs/{job_id}/events": "read",
    "POST /api/v1/handoffs/jobs/{job_id}/heartbeat": "run",
    "POST /api/v1/handoffs/jobs/{job_id}/reject": "run",
    "GET /api/v1/handoffs/jobs/{job_id}/reopen-context": "read",
    "POST /api/v1/handoffs/jobs/{job_id}/status": "run",
    "GET /api/v1/handoffs/me": "read",
    "GET /api/v1/handoffs/transitions": "read",
    "GET /api/v1/keys": "admin",
    "POST /api/v1/keys": "admin",
    "GET /api/v1/keys/me": "read",
    "DELETE /api/v1/keys/{key_id}": "admin",
    "GET /api/v1/manifest-schema": "read",
    "GET /api/v1/nodes": "read",
    "GET /api/v1/replays/{run_id}": "read",
    "GET /api/v1/roles": "read",
    "POST /api/v1/roles": "admin",
    "PATCH /api/v1/roles/{role}": "admin",
    "POST /api/v1/roles/{role}/retire": "admin",
    "GET /api/v1/runs": "read",
    "GET /api/v1/runs/{run_id}": "read",
    "GET /api/v1/runs/{run_id}/artifacts": "read",
    "GET /api/v1/runs/{run_id}/artifacts/{name}": "read",
    "POST /api/v1/runs/{run_id}/cancel": "run",
    "GET /api/v1/runs/{run_id}/logs": "read",
    "GET /api/v1/runs/{run_id}/logs/stream": "read",
    # A version other than the active one, or forcing a paused worker, needs deploy too.
    "POST /api/v1/runs/{run_id}/replay": "run",
    "POST /api/v1/runs/{run_id}/replays": "run",
    "GET /api/v1/runs/{run_id}/tool-calls": "read",
    "GET /api/v1/runs/{run_id}/transcript": "read",
    "GET /api/v1/secrets": "deploy",
    "DELETE /api/v1/secrets/{name}": "deploy",
    "PUT /api/v1/secrets/{name}": "deploy",
    "GET /api/v1/workers": "read",
    "POST /api/v1/workers": "deploy",
    "POST /api/v1/workers/validate": "read",
    "DELETE /api/v1/workers/{name}": "deploy",
    "GET /api/v1/workers/{name}": "read",
    "GET /api/v1/workers/{name}/deliveries": "read",
    "POST /api/v1/workers/{name}/evals": "run",
    "POST /api/v1/workers/{name}/pause": "deploy",
    "POST /api/v1/workers/{name}/resume": "deploy",
    "POST /api/v1/workers/{name}/rollback": "deploy",
    "POST /api/v1/workers/{name}/runs": "run",
    "GET /api/v1/workers/{name}/state": "read",
    "PUT /api/v1/workers/{name}/state": "deploy",
    "GET /api/v1/workers/{name}/state/versions": "read",
    "GET /api/v1/workers/{name}/triggers": "read",
    "GET /api/v1/workers/{name}/versions": "read",
    "GET /api/v1/workers/{name}/versions/{version_id}": "read",
}
# The MCP tools and their scopes, written out for the same reason (a worker exposed as a
# tool of its own needs `run`).
TOOL_SCOPES: dict[str, str] = {
    **dict.fromkeys(
        "get_artifact get_eval get_replay get_run get_run_logs get_worker get_worker_state "
        "handoff_get_job handoff_list_jobs handoff_my_roles handoff_reopen_context "
        "list_alert_channels list_alert_deliveries list_alert_rules list_approvals list_runs "
        "list_triggers list_versions list_worker_state_versions list_workers validate_worker "
        "watch_run".split(),
        "read",
    ),
    **dict.fromkeys(
        "cancel_run decide_approval eval_worker handoff_claim_job handoff_claim_next_job "
        "handoff_complete_job handoff_create_job handoff_heartbeat handoff_reject_job "
        "handoff_set_status handoff_update_job replay_recorded_run replay_run "
        "run_worker".split(),
        "run",
    ),
    **dict.fromkeys(
        "add_alert_channel add_alert_rule delete_secret delete_worker deploy_worker "
        "list_secrets pause_worker resend_alert_delivery resume_worker rollback_worker "
        "set_alert_rule_enabled set_secret set_worker_state test_alert_channel "
        "update_alert_channel".split(),
        "deploy",
    ),
}


def test_every_api_route_needs_the_scope_its_row_in_the_table_says(server: LiveServer) -> None:
    walked = {f"{method} {path}": scope for method, path, scope in _api_routes(server)}
    unlisted = sorted(set(walked) - set(ROUTE_SCOPES))
    assert unlisted == [], (
        f"routes with no row in ROUTE_SCOPES (add each with its scope): {unlisted}"
    )
    assert sorted(set(ROUTE_SCOPES) - set(walked)) == [], "rows of ROUTE_SCOPES with no route"
    differ = {k: (walked[k], v) for k, v in ROUTE_SCOPES.items() if walked[k] != v}
    assert differ == {}, f"(route's scope, table's scope): {differ}"


def test_every_mcp_tool_needs_the_scope_its_row_in_the_table_says() -> None:
    declared = {name: mcp_tools.scope_of(name) for name in mcp_tools.TOOL_NAMES}
    assert declared == TOOL_SCOPES
    assert mcp_tools.scope_of("some-exposed-worker") == "run"


def test_the_openapi_document_lists_no_route_the_walk_does_not_know(server: LiveServer) -> None:
    walked = {(m, p) for m, p, _ in _api_routes(server)}
    with server.client() as api:
        document: dict[str, Any] = api.get("/openapi.json").json()
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        if path.startswith(API)
        for method in operations
        if method in {"get", "post", "put", "patch", "delete"}
    }
    assert documented <= walked


def test_each_route_refuses_no_key_and_every_lower_scope_and_admits_its_own(
    server: LiveServer,
) -> None:
    # Keys of an agent, so the handoff routes (which also need an agent) admit them too.
    tokens = agent_keys_by_scope(server.ctx, "walker")
    wrong: list[str] = []
    with ExitStack() as stack:
        anonymous = stack.enter_context(server.client(key=""))
        clients = {held: stack.enter_context(server.client(key=tokens[held])) for held in SCOPES}
        for method, path, scope in _api_routes(server):
            if scope is None:
                continue
            url = _concrete(path)
            status = anonymous.request(method, url, json={}).status_code
            if status != 401:
                wrong.append(f"{method} {path} without a key answered {status}, not 401")
            for held, api in clients.items():
                resp = api.request(method, url, json={}, params={"wait": 0})
                allowed = grants([held], scope)
                if not allowed and (resp.status_code != 403 or _code(resp) != "forbidden"):
                    wrong.append(f"{method} {path} with {held} answered {resp.status_code}")
                if allowed and resp.status_code in (401, 403):
                    wrong.append(
                        f"{method} {path} refused {held} ({resp.status_code}), needs {scope}"
                    )
        # One client per key for the whole walk: no answer may have set a cookie that
        # would stand in for the key in the requests after it.
        assert not any(c.cookies for c in (anonymous, *clients.values()))
    assert wrong == [], "\n".join(wrong)


def _code(resp: Any) -> str | None:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


EXPOSED_YML = """\
name: walked
inputs:
  text: {type: string, required: true}
expose: [mcp]
"""


def test_each_mcp_tool_refuses_no_key_and_every_lower_scope_and_admits_its_own(
    server: LiveServer, tmp_path: Path
) -> None:
    # A worker exposed as a tool, so that kind of tool is walked too; its required input
    # makes an admitted call with no arguments fail on the input, starting nothing.
    with server.client() as api:
        deploy_folder(api, make_worker(tmp_path / "walked", EXPOSED_YML, {"run.py": "pass\n"}))
    tokens = agent_keys_by_scope(server.ctx, "walker")
    wrong: list[str] = []

    async def walk() -> None:
        async with http_client(server) as admin:
            listed = (await admin.list_tools()).tools
        names = [t.name for t in listed]
        assert "walked" in names, names
        assert "deploy_worker" in names, names
        with plain_client(server.base_url, timeout=30) as anonymous:
            for name in names:
                unauthenticated = _mcp_call_without_key(anonymous, name)
                if unauthenticated != (401, "unauthorized"):
                    wrong.append(f"{name} without a key answered {unauthenticated}")
        for held in SCOPES:
            async with http_client(server, tokens[held]) as mcp:
                shown = {t.name for t in (await mcp.list_tools()).tools}
                allowed = {n for n in names if grants([held], mcp_tools.scope_of(n))}
                if shown != allowed:
                    wrong.append(f"tools/list for {held} shows {sorted(shown ^ allowed)} wrongly")
                for name in names:
                    needed = mcp_tools.scope_of(name)
                    result = await mcp.call_tool(name, {})
                    code = ((result.structured_content or {}).get("error") or {}).get("code")
                    if name not in allowed and code != "forbidden":
                        wrong.append(f"{name} with {held} answered {code}, not forbidden")
                    if name in allowed and code in ("forbidden", "unauthorized"):
                        wrong.append(f"{name} refused {held} ({code}), needs {needed}")

    anyio.run(walk)
    assert wrong == [], "\n".join(wrong)


def _mcp_call_without_key(anonymous: httpx.Client, tool: str) -> tuple[int, str | None]:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    resp = anonymous.post("/mcp", json=message, headers=headers)
    return resp.status_code, _code(resp)


# -- services: the rule itself, below every surface --------------------------------------------

# The reads each surface serves. Every one decides access itself (caller.require), so a new
# surface that forgets to check cannot read around it.
READ_SERVICES = (
    "runs.agent.list_tool_calls runs.agent.load_transcript runs.approvals.approvals_of_run "
    "runs.approvals.get_approval runs.approvals.list_approvals access.audit.list_events "
    "workers.diffs.diff_versions replays.evals.eval_report replays.evals.get_eval "
    "replays.evals.select_runs access.keys.get_key access.keys.key_names access.keys.list_keys "
    "runs.lineage.child_runs runs.lineage.last_runs runs.logs.list_events runs.logs.tail_events "
    "ops.metrics.exposition ops.nodes.list_nodes replays.recordings.load_recording "
    "replays.replay.get_replay replays.replay.replay_of_run replays.replay.replay_report "
    "replays.replay.replays_of_eval runs.records.run_extras runs.records.run_record "
    "runs.stats.daily_history runs.waits.wait_for_end runs.lifecycle.get_run "
    "runs.lifecycle.list_artifacts runs.lifecycle.list_runs runs.lifecycle.read_artifact "
    "runs.lifecycle.version_of_run access.secrets.list_secrets triggers.registry.get_trigger "
    "triggers.registry.list_triggers triggers.registry.summary triggers.webhooks.get_delivery "
    "triggers.webhooks.list_deliveries workers.versions.get_version workers.versions.get_worker "
    "workers.versions.list_versions workers.versions.list_workers "
    "workers.versions.validate_archive handoffs.agents.get_agent handoffs.agents.list_agents "
    "handoffs.agents.list_roles"
).split()


# Functions that take a caller to apply a rule about it, after the service that calls them
# has checked its scope, and read nothing themselves.
RULES_ABOUT_THE_CALLER = {
    "workers.exposure.check_exposed": "create_run's surface check",
    "workers.exposure.check_deploy_choices": "create_run's version and force check",
    "runs.lifecycle.check_exposed_now": "create_run's and start_eval's surface check",
}


def _services_taking_a_caller() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for info in pkgutil.walk_packages(floom.services.__path__, "floom.services."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name.startswith("_"):
                continue
            param = inspect.signature(fn).parameters.get("caller")
            dotted = f"{info.name.removeprefix('floom.services.')}.{name}"
            if dotted in RULES_ABOUT_THE_CALLER:
                continue
            if param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY:
                found[dotted] = fn
    return found


def test_every_read_service_takes_the_caller() -> None:
    walked = _services_taking_a_caller()
    assert [name for name in READ_SERVICES if name not in walked] == []


def test_every_service_refuses_a_caller_without_a_scope_before_reading_anything(
    ctx: Context,
) -> None:
    # A key with no scope at all: what a surface that forgot to check would pass along.
    nobody = Principal(key_id="key_nobody", name="nobody", scopes=())
    wrong: list[str] = []
    for name, fn in sorted(_services_taking_a_caller().items()):
        args, kwargs = _placeholders(fn, ctx)
        try:
            result = fn(*args, **kwargs, caller=nobody)
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except Forbidden as exc:
            if exc.details.get("scope_needed") not in SCOPES:
                wrong.append(f"{name} refused without naming the scope it needs")
            continue
        except Exception as exc:  # any other outcome is the finding
            wrong.append(f"{name} looked at its arguments first ({type(exc).__name__}: {exc})")
            continue
        wrong.append(f"{name} answered a caller without a scope")
    assert wrong == [], "\n".join(wrong)


def _placeholders(fn: Callable[..., Any], ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """Arguments no service could act on: the refusal must come before they are looked at."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name == "caller" or param.default is not inspect.Parameter.empty:
            continue
        value = ctx if param.name == "ctx" else "nope-0"
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return args, kwargs
