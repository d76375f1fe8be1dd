"""Hints name what the caller can use: the REST request for a plain REST client, the `floom`
command for floom's CLI (which says so in X-Floom-Client), the MCP tool over MCP."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import anyio
import httpx
import pytest

from floom.api.app import create_app
from floom.hints import SERVER_COMMANDS, Action, act, told
from floom.hints import cli as cli_hints
from floom.hints import mcp as mcp_hints
from floom.hints import rest as rest_hints
from floom.hints import ui as ui_hints
from floom.mcp.tools import core as mcp_tools
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.ui import admin as ui_admin
from floom.ui import app as ui
from floom.ui import approvals as ui_approvals
from floom.ui import handoffs as ui_handoffs
from floom.ui import monitoring as ui_monitoring
from floom.ui import ops as ui_ops
from floom.ui import replays as ui_replays
from floom.ui import runs as ui_runs
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, fast_settings
from tests.support.hints import every_action
from tests.support.mcp_clients import call, call_error, http_client

FLOOM = Path(__file__).resolve().parents[3] / "floom"
ONE_DATABASE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
CLI = {"X-Floom-Client": "cli"}
REST_REQUEST = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/api/v1/[^ `?]*)")
UI_ROUTERS = [
    m.router
    for m in (ui, ui_admin, ui_approvals, ui_handoffs, ui_monitoring, ui_ops, ui_replays, ui_runs)
]
UI_PAGE = re.compile(r"\((/[^)?\s]*)[^)]*\)")

# Operations only an operator at the node's shell gives (starting, checking, backing up a
# node): no surface but the CLI has them.
OPERATOR_COMMANDS = frozenset(
    {"serve", "mcp", "backup", "restore", "migrate-store", "doctor", "retention", "blobs"}
)


def _name(action: Action) -> str:
    return cli_hints.line(action)[0]


@ONE_DATABASE
def test_a_paused_worker_is_explained_in_each_callers_terms(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    assert api.post("/api/v1/workers/hello/pause").status_code == 200

    rest = api.post("/api/v1/workers/hello/runs", json={}).json()["error"]
    assert rest["code"] == "worker_paused"
    assert "`POST /api/v1/workers/hello/resume`" in rest["hint"]
    assert '`POST /api/v1/workers/hello/runs {"inputs": {}, "force": true}`' in rest["hint"]
    assert "floom" not in rest["hint"]

    cli = api.post("/api/v1/workers/hello/runs", json={}, headers=CLI).json()["error"]
    assert "`floom resume hello`" in cli["hint"]
    assert "`floom run hello --force`" in cli["hint"]

    async def over_mcp() -> None:
        async with http_client(server) as mcp:
            error = await call_error(mcp, "run_worker", worker="hello")
            assert "resume_worker(worker='hello')" in error["hint"]
            assert "run_worker(worker='hello', force=True)" in error["hint"]
            assert "floom" not in error["hint"]
            assert "/api/v1" not in error["hint"]
            assert (await call(mcp, "resume_worker", worker="hello"))["items"] is not None

    anyio.run(over_mcp)


@ONE_DATABASE
def test_a_missing_scope_names_how_each_caller_gets_a_key_with_it(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    with server.client(read_key) as reader:
        rest = reader.post("/api/v1/workers/hello/runs", json={}).json()["error"]
        cli = reader.post("/api/v1/workers/hello/runs", json={}, headers=CLI).json()["error"]
    assert rest["code"] == cli["code"] == "forbidden"
    assert '`POST /api/v1/keys {"scopes": ["run"]}`' in rest["hint"]
    assert "floom" not in rest["hint"]
    assert "`floom keys create --scope run`" in cli["hint"]

    async def over_mcp() -> None:
        async with http_client(server, read_key) as mcp:
            error = await call_error(mcp, "run_worker", worker="hello")
            assert error["code"] == "forbidden"
            assert "'run' scope" in error["hint"]
            assert "floom keys" not in error["hint"]
            assert "/api/v1" not in error["hint"]

    anyio.run(over_mcp)


@ONE_DATABASE
def test_a_missing_run_points_a_rest_client_at_the_runs_endpoint(
    server: LiveServer, api: httpx.Client
) -> None:
    rest = api.get("/api/v1/runs/run_nope").json()["error"]
    assert rest["code"] == "not_found"
    assert rest["hint"] == "`GET /api/v1/runs` lists recent runs"
    cli = api.get("/api/v1/runs/run_nope", headers=CLI).json()["error"]
    assert cli["hint"] == "`floom runs` lists recent runs"
    # A client that claims another surface is a plain REST client.
    other = api.get("/api/v1/runs/run_nope", headers={"X-Floom-Client": "curl"}).json()
    assert other["error"]["hint"] == rest["hint"]


@ONE_DATABASE
def test_a_run_that_is_not_a_replay_names_how_to_replay_that_very_run(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run_id = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "x"}}).json()["id"]
    rest = api.get(f"/api/v1/replays/{run_id}").json()["error"]
    assert rest["code"] == "not_found"
    assert f'`POST /api/v1/runs/{run_id}/replays {{"mode": "exact"}}`' in rest["hint"]
    cli = api.get(f"/api/v1/replays/{run_id}", headers=CLI).json()["error"]
    assert f"`floom replay {run_id} --against VERSION`" in cli["hint"]


@ONE_DATABASE
def test_a_read_key_over_rest_is_told_the_scope_a_recommended_request_needs(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run_id = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "x"}}).json()["id"]
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    replay = f'`POST /api/v1/runs/{run_id}/replays {{"mode": "exact"}}`'
    with server.client(read_key) as reader:
        hint = reader.get(f"/api/v1/replays/{run_id}").json()["error"]["hint"]
        assert f"{replay} (a request for a key with the 'run' scope, which this key lacks)" in hint
        cli = reader.get(f"/api/v1/replays/{run_id}", headers=CLI).json()["error"]["hint"]
        assert "lacks" not in cli
        # A key that may not run is told that the key it needs is an admin's to create.
        refused = reader.post("/api/v1/workers/hello/runs", json={}).json()["error"]["hint"]
        assert '`POST /api/v1/keys {"scopes": ["run"]}` (a request for a key with the ' in (refused)
        assert "'admin' scope, which this key lacks)" in refused
    hint = api.get(f"/api/v1/replays/{run_id}").json()["error"]["hint"]
    assert replay in hint
    assert "lacks" not in hint


def test_every_action_a_hint_names_is_an_endpoint_that_exists_or_said_to_be_an_operators(
    tmp_path: Path,
) -> None:
    app = create_app(fast_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}"))
    routes = {
        (method.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    kept = set()
    for action in every_action():
        told = rest_hints.action(action)
        command = cli_hints.command(action)
        if told.startswith(f"{command} ("):
            assert _name(action) in SERVER_COMMANDS, told
            assert told.endswith(
                "(an operator's command, run on the floom server's host; no endpoint does it)"
            ), told
            kept.add(_name(action))
            continue
        if told == command:
            kept.add(_name(action))
            continue
        requests = REST_REQUEST.findall(told)
        assert requests, (action, told)
        for method, path in requests:
            assert any(m == method and p.match(path) for m, p in routes), (action, told)
    # What a REST client cannot do over REST is an operator's: starting or checking a node.
    assert kept <= OPERATOR_COMMANDS, kept


def test_every_action_a_hint_names_is_a_ui_page_that_exists_or_said_to_be_a_command() -> None:
    pages = [
        re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", route.path) + "$")
        for router in UI_ROUTERS
        for route in router.routes
        if "GET" in (getattr(route, "methods", None) or ())
    ]
    at_a_shell = set()
    for action in every_action():
        told = ui_hints.action(action)
        command = cli_hints.command(action)
        assert told != command, f"{command} is shown to a person at the UI as it is"
        if told.startswith(f"{command} ("):
            # No page does it: the person is told whose command it is and where it runs.
            at_a_shell.add(_name(action))
            said = told[len(f"{command} (") :]
            if _name(action) in OPERATOR_COMMANDS - {"mcp"}:
                assert said.startswith("an operator's command, run on the floom server's host")
            else:
                assert "floom CLI" in said or "MCP server" in said, told
            continue
        assert "`floom" not in told, (action, told)
        shown = UI_PAGE.findall(told)
        assert shown, (action, told)
        for path in shown:
            assert any(page.match(path) for page in pages), (action, told)
    # The UI has no page to deploy a folder, manage agents and roles, or run a node.
    assert at_a_shell <= OPERATOR_COMMANDS | {"deploy", "agents", "roles"}, at_a_shell
    assert {"deploy", "agents", "serve", "backup"} <= at_a_shell


def test_a_person_at_the_ui_is_told_plainly_what_only_a_shell_can_do() -> None:
    assert ui_hints.render(told("deploy one with ", act("deploy", folder="FOLDER"))) == (
        "deploy one with `floom deploy FOLDER` (a command of the floom CLI, which uploads the "
        "worker's folder; the web UI cannot deploy)"
    )
    assert ui_hints.render(told("back it up with ", act("backup"))) == (
        "back it up with `floom backup` (an operator's command, run on the floom server's "
        "host; the web UI cannot do it)"
    )
    assert ui_hints.render(told("see ", act("eval", worker="lookup", version="v_2"))) == (
        "see Eval against v_2 on the worker's page (/workers/lookup)"
    )
    # Each replay is the run page's button that does it.
    replays = told(
        act("replay", run_id="r_1", exact=True), " or ", act("replay", run_id="r_1", version="v_2")
    )
    assert ui_hints.render(replays) == (
        "Replay exactly from the recording on the run's page (/runs/r_1) or What-if on the "
        "active version on the run's page (/runs/r_1)"
    )


MCP_CALL = re.compile(r"\b([a-z_]+)\(([^()]*)\)")


def test_every_action_a_hint_names_is_an_mcp_tool_call_it_can_make() -> None:
    tools = {t.name: set(inspect.signature(t.fn).parameters) - {"ctx"} for t in mcp_tools.TOOLS}
    operators = set()
    for action in every_action():
        told = mcp_hints.action(action)
        if told.endswith("no MCP tool does it)"):
            operators.add(_name(action))
            continue
        if action.op == "mcp":  # the stdio server on the agent's own machine, named as such
            continue
        assert "`floom" not in told, (action, told)
        assert "/api/v1" not in told, (action, told)
        # An option of the CLI (--to, --skip-eval-gate) is an argument of the tool instead.
        assert not re.search(r"(^|[\s(])--?[a-z]", told), (action, told)
        calls = MCP_CALL.findall(told)
        assert calls, (action, told)
        for tool, arguments in calls:
            assert tool in tools, (action, told)
            named = {a.split("=")[0].strip() for a in arguments.split(",") if "=" in a}
            assert named <= tools[tool], (action, told, named - tools[tool])
    assert not operators & {"deploy", "eval", "replay", "run", "rollback", "resume"}, operators


# Modules whose errors only floom's operator commands raise (backup, restore, copying a store),
# which no MCP or REST caller reaches: their hints may name those commands' options.
OPERATOR_MODULES = frozenset({"backup.py", "store_copy.py", "doctor.py"})


def _hint_texts(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg != "hint":
                continue
            parts = [
                n.value
                for n in ast.walk(keyword.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            found.append((node.lineno, "".join(parts)))
    return found


def test_no_hint_names_a_cli_option_or_a_rest_path_outside_a_command_a_surface_retells() -> None:
    bare = []
    for path in FLOOM.rglob("*.py"):
        if {"cli", "hints"} & set(path.relative_to(FLOOM).parts) or path.name in OPERATOR_MODULES:
            continue
        for line, text in _hint_texts(ast.parse(path.read_text())):
            outside = re.sub(r"`[^`]*`", "", text)
            if re.search(r"(^|[\s(])--[a-z]|/api/v1|\?[a-z_]+=", outside):
                bare.append(f"{path.relative_to(FLOOM)}:{line}: {text}")
    assert bare == []


@ONE_DATABASE
def test_a_read_key_over_mcp_is_recommended_only_tools_it_may_call(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run_id = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "x"}}).json()["id"]
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")

    async def over_mcp() -> None:
        async with http_client(server, read_key) as mcp:
            said = mcp.instructions or ""
            listed = {t.name for t in (await mcp.list_tools()).tools}
            named = set(re.findall(r"\b(?:[a-z]+_)+[a-z]+\b", said)) & set(mcp_tools.TOOL_NAMES)
            assert named, named - listed
            assert named <= listed, named - listed
            assert "deploy_worker" not in said
            assert "run_worker" not in said
            assert "list_runs" in said

            error = await call_error(mcp, "get_replay", run_id=run_id)
            assert "replay_recorded_run(" in error["hint"]
            assert "a tool for a key with the 'run' scope, which this key lacks" in error["hint"]
        async with http_client(server) as mcp:
            said = mcp.instructions or ""
            assert "deploy_worker" in said
            assert "handoff_claim_next_job" in said
            error = await call_error(mcp, "get_replay", run_id=run_id)
            assert "replay_recorded_run(" in error["hint"]
            assert "lacks" not in error["hint"]

    anyio.run(over_mcp)
