"""Hints are structured actions declared where they are said, which each surface renders: every
catalogued action renders on every surface, reads back from what floom stores, and no module
retells hints by regex or writes a `floom ...` command as text instead of an action."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from floom.errors import Forbidden, InvalidRequest
from floom.hints import Action, Hint, KeyWith, Surface, act, told
from floom.hints import cli as cli_hints
from floom.hints import mcp as mcp_hints
from floom.hints import rest as rest_hints
from floom.hints import ui as ui_hints
from floom.hints.surface import render, tell
from floom.manifest.schema import Problem
from floom.mcp.backends.rest import setup_hint
from floom.schemas.workers import ValidationResult
from floom.services.access.principal import Principal
from floom.services.ops.doctor import Check
from floom.services.workers.versions import Validation
from tests.support.hints import FLOOM, act_calls, every_action

SURFACES: tuple[Surface, ...] = ("cli", "rest", "mcp", "ui")
# Where a `floom ...` command may be written as text, and why: the CLI's own words and the
# hints' catalogue.
TEXT_MODULES = ("cli/", "hints/")
# And single texts: the OpenAPI document's prose, a line of the server's log, a manifest
# problem's detail.
TEXT_ALLOWED = {
    "api/openapi.py": "a floom API key (`floom keys create`)",
    "api/routes/workers.py": "`floom deploy FOLDER` builds it",
    "services/triggers/webhooks.py": "(`floom secrets set %s`)",
}


def _normal(action: Action) -> Action:
    return Action(action.op, tuple(sorted(action.args)))


@pytest.mark.parametrize("action", every_action(), ids=repr)
def test_every_catalogued_action_renders_on_every_surface(action: Action) -> None:
    said = {surface: render(told("try ", action), surface=surface) or "" for surface in SURFACES}
    assert said["cli"] == f"try {cli_hints.command(action)}"
    assert said["cli"].startswith("try `floom ")
    command = cli_hints.command(action)
    kept: list[tuple[Surface, frozenset[str]]] = [
        ("rest", rest_hints.NO_ENDPOINT),
        ("mcp", mcp_hints.NO_TOOL),
        ("ui", ui_hints.NO_PAGE),
    ]
    for surface, keeps in kept:
        assert said[surface].startswith("try ")
        if action.op in keeps:
            # No equivalent there: the command stays, said to be an operator's or the CLI's
            # (or, the stdio MCP server, as it is where it is explained).
            assert said[surface].startswith(f"try {command}"), (surface, said)
        else:
            assert "`floom" not in said[surface], (surface, said)
    assert "/api/v1" not in said["mcp"] + said["ui"]


def test_what_each_surface_has_no_equivalent_for_is_decided() -> None:
    operator = {
        "serve",
        "backup",
        "migrate-store",
        "blobs check",
        "blobs migrate",
        "blobs held-back",
        "blobs give-up",
        "retention compact",
        "mcp",
    }
    assert operator == rest_hints.NO_ENDPOINT
    assert (
        operator
        | {
            "deliveries",
            "nodes",
            "keys list",
            "keys create",
            "agents list",
            "agents create",
            "roles list",
        }
        == mcp_hints.NO_TOOL
    )
    assert operator | {"deploy", "agents list", "agents create", "roles list"} == ui_hints.NO_PAGE


@pytest.mark.parametrize("action", every_action(), ids=repr)
def test_a_stored_action_reads_back_as_the_action_it_was(action: Action) -> None:
    stored = cli_hints.written(told("it says ", action, "; then more"))
    (read,) = cli_hints.parse(stored).actions()
    assert _normal(read) == _normal(action)
    assert cli_hints.written(cli_hints.parse(stored)) == stored


def test_stored_text_is_told_in_each_surfaces_terms_and_unknown_commands_stay_text() -> None:
    stored = "decide with `floom approve a_1`; or `floom frobnicate x` or `floom approve 'x`"
    assert tell(stored, surface="rest") == (
        "decide with `POST /api/v1/approvals/a_1/approve`; or `floom frobnicate x` or "
        "`floom approve 'x`"
    )
    assert tell(stored, surface="cli") == stored
    assert tell(None, surface="mcp") is None


def test_plain_text_is_said_as_it_is_on_every_surface() -> None:
    # An error a server already told for MCP, passed on by the stdio server, is not told again.
    text = "`floom agents create` (a command of the floom CLI for floom's operator; no MCP tool)"
    for surface in SURFACES:
        assert render(text, surface=surface) == text
        assert render(Hint.of(text), surface=surface) == text


def test_a_scope_aware_rendering_names_the_scope_a_recommended_action_needs() -> None:
    hint = told("resume it with ", act("resume", worker="w"))
    assert render(hint, surface="mcp", lacked_tool=lambda tool: "run") == (
        "resume it with resume_worker(worker='w') (a tool for a key with the 'run' scope, which "
        "this key lacks)"
    )
    assert render(hint, surface="mcp", lacked_tool=lambda tool: None) == (
        "resume it with resume_worker(worker='w')"
    )
    assert render(hint, surface="rest", lacked_request=lambda request: "run") == (
        "resume it with `POST /api/v1/workers/w/resume` (a request for a key with the 'run' "
        "scope, which this key lacks)"
    )


def test_an_action_names_only_an_operation_and_arguments_of_the_catalogue() -> None:
    with pytest.raises(ValueError, match="no operation"):
        act("frobnicate")
    with pytest.raises(ValueError, match="no argument"):
        act("resume", run_id="r_1")
    # Not given: None and False.
    assert act("run", worker="w", force=False) == Action("run", (("worker", "w"),))


def test_every_action_floom_declares_is_catalogued() -> None:
    calls = act_calls()
    assert len(calls) > 50
    for path, call in calls:
        where = f"{path.relative_to(FLOOM)}:{call.lineno}"
        first = call.args[0]
        assert isinstance(first, ast.Constant), where
        assert first.value in cli_hints.OPS, where
        names = {k.arg for k in call.keywords}
        assert names <= cli_hints.OPS[first.value].names(), where


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            found.add(id(body[0].value))
    return found


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(FLOOM).as_posix(), ast.parse(path.read_text()))
        for path in sorted(FLOOM.rglob("*.py"))
    ]


def test_no_hint_or_message_writes_a_floom_command_as_text() -> None:
    written = []
    for name, tree in _modules():
        if name.startswith(TEXT_MODULES):
            continue
        allowed = TEXT_ALLOWED.get(name)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "`floom " in node.value
                and id(node) not in docstrings
                and not (allowed and allowed in node.value)
            ):
                written.append(f"{name}:{node.lineno}: {node.value}")
    assert written == [], "declare the action with floom.hints.act instead"


REGEX_CALLS = {"compile", "sub", "subn", "search", "match", "fullmatch", "findall", "finditer"}


def test_no_module_retells_hints_by_regex() -> None:
    retelling = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            # The retellings that were: one regex pass over the text per surface.
            if isinstance(node, ast.FunctionDef) and node.name in {
                "retell",
                "for_mcp",
                "for_rest",
                "for_ui",
                "for_scope",
            }:
                retelling.append(f"{name}: def {node.name}")
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in REGEX_CALLS
            ):
                continue
            pattern = "".join(
                n.value
                for arg in node.args[:1]
                for n in ast.walk(arg)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            )
            # A pattern over `floom ...` commands or over tool calls in a hint's text.
            if "floom" in pattern or r"\((?:[^()]*)\)" in pattern:
                retelling.append(f"{name}: {pattern}")
    # The one decoder of what floom stored (in the CLI's notation) back into actions.
    assert retelling == ["hints/cli.py: `floom ([^`]*)`"]
    for module in ("hints/action.py", "hints/mcp.py", "hints/rest.py", "hints/ui.py"):
        tree = ast.parse((FLOOM / module).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "re" not in imported, module


def test_an_error_keeps_its_words_structured_and_says_them_as_the_cli_writes_them() -> None:
    from floom.errors import WorkerPaused

    error = WorkerPaused("paused", hint=told("resume it with ", act("resume", worker="w")))
    assert error.hint == "resume it with `floom resume w`"
    assert error.advice is not None
    assert error.advice.actions() == [act("resume", worker="w")]
    assert error.message == "paused"
    assert error.said == Hint(("paused",))
    assert error.to_dict()["hint"] == error.hint


def test_the_layout_of_the_hints_package_is_one_module_per_surface() -> None:
    names = {p.name for p in (Path(FLOOM) / "hints").glob("*.py")}
    assert names == {
        "__init__.py",
        "action.py",
        "cli.py",
        "mcp.py",
        "rest.py",
        "ui.py",
        "surface.py",
    }


def test_a_key_to_use_is_told_as_each_surfaces_caller_gets_and_uses_one() -> None:
    hint = told("use ", KeyWith("run"))
    said = {surface: render(hint, surface=surface) or "" for surface in SURFACES}
    assert said["cli"] == "use a key created with `floom keys create --scope run` (or higher)"
    assert said["rest"] == (
        'use a key created with `POST /api/v1/keys {"scopes": ["run"]}` (or higher)'
    )
    assert "'run' scope" in said["mcp"]
    assert "configure this MCP client" in said["mcp"]
    assert "'run' scope" in said["ui"]
    assert "sign in" in said["ui"]
    assert "floom" not in said["mcp"] + said["ui"]
    assert "/api/v1" not in said["mcp"] + said["ui"]
    # A REST caller that may not create keys is told which scope that takes.
    lacking = render(hint, surface="rest", lacked_request=lambda request: "admin")
    assert "(a request for a key with the 'admin' scope, which this key lacks)" in (lacking or "")


@pytest.mark.parametrize("surface", ["rest", "cli", "mcp", "ui"])
def test_a_missing_scope_is_one_hint_whatever_surface_the_caller_came_from(
    surface: Surface,
) -> None:
    caller = Principal(key_id="k", name="reader", scopes=("read",), surface=surface)
    with pytest.raises(Forbidden) as refused:
        caller.require("deploy")
    # Rendered where it is answered, for that answer's surface: not worded by the principal.
    assert refused.value.advice == told("use ", KeyWith("deploy"))
    assert refused.value.hint == (
        "use a key created with `floom keys create --scope deploy` (or higher)"
    )


def test_the_hints_in_an_errors_details_are_told_on_each_surface() -> None:
    hint = told("set it first: ", act("secrets set", name="HOOK_KEY"))
    error = InvalidRequest("bad", details=[{"path": "config.secret", "hint": hint}])
    assert error.details == [
        {"path": "config.secret", "hint": "set it first: `floom secrets set HOOK_KEY`"}
    ]
    for_mcp = error.details_for(lambda t: render(t, surface="mcp"))
    assert for_mcp[0]["hint"] == "set it first: set_secret(name='HOOK_KEY', value=VALUE)"
    for_ui = error.details_for(lambda t: render(t, surface="ui"))
    assert for_ui[0]["hint"] == "set it first: the Secrets page (/secrets), adding HOOK_KEY"
    # Details set as plain data stay as they are.
    error.details = {"stderr": "x"}
    assert error.details_for(lambda t: "told") == {"stderr": "x"}


def test_a_manifest_problems_hint_is_told_in_the_callers_terms() -> None:
    hint = told("set it with ", act("secrets set"))
    problems = [Problem("mcp.linear.auth_secret", "is not a secret name", hint)]
    told_as: list[tuple[Surface, str]] = [
        ("cli", "set it with `floom secrets set`"),
        ("rest", 'set it with `PUT /api/v1/secrets/NAME {"value": "VALUE"}`'),
        ("mcp", "set it with set_secret(name=NAME, value=VALUE)"),
    ]
    for surface, expected in told_as:
        result = ValidationResult.of(Validation(None, problems), surface=surface)
        assert result.problems[0].hint == expected


def test_doctors_fixes_are_actions_printed_as_the_cli_writes_them() -> None:
    check = Check("database", "warn", "no database yet", told(act("serve"), " creates it"))
    assert check.to_dict()["fix"] == "`floom serve` creates it"


def test_the_stdio_servers_setup_hint_names_its_commands_as_actions() -> None:
    hint = setup_hint()
    assert {a.op for a in hint.actions()} == {"mcp", "serve", "keys create"}
    assert "`floom keys create --scope deploy`" in cli_hints.written(hint)
