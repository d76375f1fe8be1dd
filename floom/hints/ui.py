"""Hints retold for a person at floom's web UI: each `floom ...` CLI command a message, hint or
stored notice names becomes the page (and the button on it) that does the same. Commands the
UI has no page for (deploying a folder, evals, starting a server, backups) stay as they are:
they are run at a shell."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from floom.hints import PLACEHOLDERS, Render, first, option, retell


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


_PAGES: dict[str, Render] = {
    "workers": _workers,
    "versions": _on_worker("the versions"),
    "rollback": _on_worker("Roll back"),
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
    "replay": _on_run("Replay"),
    "approvals": lambda w: "the Approvals page (/approvals)",
    "approve": lambda w: "Approve on the Approvals page (/approvals)",
    "reject": lambda w: "Reject, with a comment, on the Approvals page (/approvals)",
    "secrets": _secrets,
    "keys": lambda w: "the Keys page (/keys)",
    "handoffs": lambda w: "the Handoffs page (/handoffs)",
    "nodes": lambda w: "the Nodes page (/nodes)",
}


def for_ui(text: str | None) -> str | None:
    """`text` with each CLI command that has a page in the UI replaced by that page."""
    return retell(text, _PAGES)
