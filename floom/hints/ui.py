"""An action rendered for a person at floom's web UI: the page (and the button on it) that
does it. An operation the UI has no page for (deploying a folder, agents and roles, starting or
backing up a server) stays a command, said plainly to be one: of the floom CLI, or of the
server's operator."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from floom.hints import ON_THE_HOST, PLACEHOLDERS, SERVER_COMMANDS, Action, Hint, KeyWith, said
from floom.hints import cli as cli_hints


def _path(*parts: str) -> str:
    return "/" + "/".join(p if p in PLACEHOLDERS else quote(p, safe="") for p in parts)


def _on_worker(button: str) -> Callable[[Action], str]:
    return lambda a: f"{button} on the worker's page ({_path('workers', a.arg('worker'))})"


def _on_run(button: str) -> Callable[[Action], str]:
    return lambda a: f"{button} on the run's page ({_path('runs', a.arg('run_id'))})"


def _runs(a: Action) -> str:
    if a.has("worker"):
        return f"the Runs page (/runs?worker={quote(a.arg('worker'))})"
    return "the Runs page (/runs)"


def _replay(a: Action) -> str:
    # The run page's buttons: a what-if there runs on the active version.
    if a.flag("exact"):
        return _on_run("Replay exactly from the recording")(a)
    if a.has("version"):
        return _on_run("What-if on the active version")(a)
    if a.flag("latest"):
        return _on_run("Replay on the active version")(a)
    return _on_run("Replay")(a)


def _eval(a: Action) -> str:
    page = _path("workers", a.arg("worker"))
    if a.has("version"):
        return f"Eval against {a.arg('version')} on the worker's page ({page})"
    return f"Eval on the worker's page ({page})"


PAGES: dict[str, Callable[[Action], str]] = {
    "workers": lambda a: "the Workers page (/)",
    "versions": _on_worker("the versions"),
    "rollback": _on_worker("Roll back"),
    "pause": _on_worker("Pause"),
    "resume": _on_worker("Resume"),
    "triggers": _on_worker("the triggers"),
    "deliveries": _on_worker("the deliveries"),
    "state get": _on_worker("the state"),
    "state history": _on_worker("the state"),
    "state set": _on_worker("the state"),
    "eval": _eval,
    "run": _on_worker("the run form"),
    "runs": _runs,
    "runs show": lambda a: f"the run's page ({_path('runs', a.arg('run_id'))})",
    "show": _on_run("everything"),
    "logs": _on_run("the log"),
    "replay": _replay,
    "approvals": lambda a: "the Approvals page (/approvals)",
    "approve": lambda a: "Approve on the Approvals page (/approvals)",
    "reject": lambda a: "Reject, with a comment, on the Approvals page (/approvals)",
    "secrets list": lambda a: "the Secrets page (/secrets)",
    "secrets set": lambda a: f"the Secrets page (/secrets), adding {a.arg('name')}",
    "secrets rm": lambda a: "the Secrets page (/secrets)",
    "keys list": lambda a: "the Keys page (/keys)",
    "keys create": lambda a: "the Keys page (/keys)",
    "handoffs list": lambda a: "the Handoffs page (/handoffs)",
    "handoffs claim-next": lambda a: "the Handoffs page (/handoffs)",
    "nodes": lambda a: "the Nodes page (/nodes)",
    **dict.fromkeys(
        [
            "alerts channels",
            "alerts channels add",
            "alerts channels rm",
            "alerts rules",
            "alerts deliveries",
        ],
        lambda a: "the Alerts page (/alerts)",
    ),
}

# What an operation the UI cannot do is, next to the command: the person at the UI may have no
# shell, or no shell on the server.
_IN_THE_CLI = "a command of the floom CLI; the web UI has no page for it"
_WHAT_IT_IS = {
    "deploy": "a command of the floom CLI, which uploads the worker's folder; "
    "the web UI cannot deploy",
    "agents": "an admin's command of the floom CLI; the web UI has no page for agents",
    "roles": "an admin's command of the floom CLI; the web UI has no page for roles",
    "mcp": "the MCP server a coding agent starts on its own machine",
    **dict.fromkeys(SERVER_COMMANDS, f"{ON_THE_HOST}; the web UI cannot do it"),
}
NO_PAGE = frozenset(set(cli_hints.OPS) - set(PAGES))


def action(a: Action) -> str:
    """The page (and its button) that does `a`; an operation with none is said to be a
    command, of the CLI or of the server's operator."""
    render = PAGES.get(a.op)
    if render is not None:
        return render(a)
    line = cli_hints.line(a)
    return said(line, _WHAT_IT_IS.get(line[0], _IN_THE_CLI))


def key(needed: KeyWith) -> str:
    """A key to use, as a person at the UI uses one: they sign in with it."""
    return f"an API key that has the '{needed.scope}' scope (or higher): sign in with one"


def render(told: Hint | None) -> str | None:
    return told.render(action, key) if told is not None else None
