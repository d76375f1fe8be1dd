"""Hints retold for a person at floom's web UI: each `floom ...` CLI command a message, hint or
stored notice names becomes the page (and the button on it) that does the same. A command the
UI has no page for (deploying a folder, agents and roles, starting or backing up a server)
stays a command, said plainly to be one: of the floom CLI, or of the server's operator."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from floom.hints import (
    ON_THE_HOST,
    PLACEHOLDERS,
    SERVER_COMMANDS,
    Render,
    first,
    option,
    retell,
    said,
)


def _path(*parts: str) -> str:
    return "/" + "/".join(p if p in PLACEHOLDERS else quote(p, safe="") for p in parts)


def _on_worker(button: str) -> Callable[[list[str]], str]:
    return lambda w: f"{button} on the worker's page ({_path('workers', first(w, 'WORKER'))})"


def _on_run(button: str) -> Callable[[list[str]], str]:
    return lambda w: f"{button} on the run's page ({_path('runs', first(w, 'RUN_ID'))})"


def _runs(words: list[str]) -> str:
    if words[:1] == ["show"]:
        return f"the run's page ({_path('runs', first(words[1:], 'RUN_ID'))})"
    if "--worker" in words:
        return f"the Runs page (/runs?worker={quote(option(words, '--worker', 'WORKER'))})"
    return "the Runs page (/runs)"


def _secrets(words: list[str]) -> str:
    if words[:1] == ["set"]:
        return f"the Secrets page (/secrets), adding {first(words[1:], 'NAME')}"
    return "the Secrets page (/secrets)"


def _workers(words: list[str]) -> str:
    if words[:1] == ["delete"]:
        return _on_worker("Delete")(words[1:])
    return "the Workers page (/)"


def _replay(words: list[str]) -> str:
    # The run page's buttons: a what-if there runs on the active version.
    if "--exact" in words:
        return _on_run("Replay exactly from the recording")(words)
    if "--against" in words:
        return _on_run("What-if on the active version")(words)
    return _on_run("Replay")(words)


def _eval(words: list[str]) -> str:
    page = _path("workers", first(words, "WORKER"))
    if "--against" in words:
        return f"Eval against {option(words, '--against', 'VERSION')} on the worker's page ({page})"
    return f"Eval on the worker's page ({page})"


# What a command the UI cannot give is, next to the command: the person at the UI may have no
# shell, or no shell on the server.
_IN_THE_CLI = "a command of the floom CLI; the web UI has no page for it"
_WHAT_IT_IS = {
    "deploy": "a command of the floom CLI, which uploads the worker's folder; "
    "the web UI cannot deploy",
    "validate": "a command of the floom CLI, which checks a worker's folder before deploying it",
    "agents": "an admin's command of the floom CLI; the web UI has no page for agents",
    "roles": "an admin's command of the floom CLI; the web UI has no page for roles",
    "mcp": "the MCP server a coding agent starts on its own machine",
    **dict.fromkeys(SERVER_COMMANDS, f"{ON_THE_HOST}; the web UI cannot do it"),
}


def _at_a_shell(words: list[str]) -> str:
    return said(words, _WHAT_IT_IS.get(words[0], _IN_THE_CLI))


_PAGES: dict[str, Render] = {
    "workers": _workers,
    "versions": _on_worker("the versions"),
    "rollback": _on_worker("Roll back"),
    "state": lambda w: _on_worker("the state")(w[1:]),
    "run": _on_worker("the run form"),
    "triggers": _on_worker("the triggers"),
    "deliveries": _on_worker("the deliveries"),
    "pause": _on_worker("Pause"),
    "resume": _on_worker("Resume"),
    "runs": _runs,
    "show": _on_run("everything"),
    "logs": _on_run("the log"),
    "artifacts": _on_run("the artifacts"),
    "cancel": _on_run("Cancel run"),
    "replay": _replay,
    "eval": _eval,
    "approvals": lambda w: "the Approvals page (/approvals)",
    "approve": lambda w: "Approve on the Approvals page (/approvals)",
    "reject": lambda w: "Reject, with a comment, on the Approvals page (/approvals)",
    "secrets": _secrets,
    "keys": lambda w: "the Keys page (/keys)",
    "handoffs": lambda w: "the Handoffs page (/handoffs)",
    "nodes": lambda w: "the Nodes page (/nodes)",
}


def for_ui(text: str | None) -> str | None:
    """`text` with each CLI command that has a page in the UI replaced by that page, and each
    other one said to be a command of the CLI or of the server's operator."""
    return retell(text, _PAGES, otherwise=_at_a_shell)
