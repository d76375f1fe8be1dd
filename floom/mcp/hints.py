"""Hints written for a person at a shell, retold for an agent over MCP: each `floom ...` CLI
command a hint or message names becomes the MCP tool (and its arguments) that does the same.

An agent over HTTP has no `floom` binary, so the services' hints, which name CLI commands,
are translated here, at the one place errors become tool errors. Commands with no tool (key,
agent and role administration, starting a server) stay as they are: an operator runs them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

_COMMAND = re.compile(r"`floom ([^`]*)`")
# The CLI's placeholders stay bare in a tool call (worker=WORKER); real values are quoted.
_PLACEHOLDERS = frozenset(
    {"WORKER", "RUN_ID", "VERSION", "NAME", "VALUE", "WHY", "APPROVAL_ID", "ID", "FOLDER"}
)


def _call(tool: str, **arguments: str | bool) -> str:
    args = ", ".join(
        f"{k}={v}" if isinstance(v, bool) or v in _PLACEHOLDERS else f"{k}={v!r}"
        for k, v in arguments.items()
    )
    return f"{tool}({args})"


def _first(words: list[str], default: str) -> str:
    return words[0] if words and not words[0].startswith("-") else default


def _option(words: list[str], name: str, default: str) -> str:
    if name in words and words.index(name) + 1 < len(words):
        return words[words.index(name) + 1]
    return default


def _runs(words: list[str]) -> str:
    if words[:1] == ["show"]:
        return _call("get_run", run_id=_first(words[1:], "RUN_ID"))
    if "--worker" in words:
        return _call("list_runs", worker=_option(words, "--worker", "WORKER"))
    return "list_runs()"


def _workers(words: list[str]) -> str:
    if words[:1] == ["delete"]:
        return _call("delete_worker", worker=_first(words[1:], "WORKER"), confirm=True)
    return "list_workers()"


def _secrets(words: list[str]) -> str:
    if words[:1] == ["set"]:
        return _call("set_secret", name=_first(words[1:], "NAME"), value="VALUE")
    return "list_secrets()"


def _handoffs(words: list[str]) -> str:
    if words[:1] == ["claim-next"]:
        return "handoff_claim_next_job()"
    return "handoff_list_jobs()"


def _decide(decision: str) -> Callable[[list[str]], str]:
    def render(words: list[str]) -> str:
        approval = _first(words, "APPROVAL_ID")
        if decision == "reject":
            return _call("decide_approval", approval_id=approval, decision="reject", comment="WHY")
        return _call("decide_approval", approval_id=approval, decision="approve")

    return render


def _worker_tool(tool: str) -> Callable[[list[str]], str]:
    return lambda words: _call(tool, worker=_first(words, "WORKER"))


def _run_tool(tool: str) -> Callable[[list[str]], str]:
    return lambda words: _call(tool, run_id=_first([w for w in words if w != "-f"], "RUN_ID"))


_TOOLS: dict[str, Callable[[list[str]], str]] = {
    "workers": _workers,
    "versions": _worker_tool("list_versions"),
    "rollback": lambda w: (
        _call("rollback_worker", worker=_first(w, "WORKER"), run_id=_option(w, "--run", "RUN_ID"))
        if "--run" in w
        else _call(
            "rollback_worker", worker=_first(w, "WORKER"), version_id=_option(w, "--to", "VERSION")
        )
    ),
    "runs": _runs,
    "show": _run_tool("get_run"),
    "logs": _run_tool("get_run_logs"),
    "artifacts": _run_tool("get_run"),
    "run": lambda w: (
        _call("run_worker", worker=_first(w, "WORKER"), force=True)
        if "--force" in w
        else _call("run_worker", worker=_first(w, "WORKER"))
    ),
    "approvals": lambda w: "list_approvals()",
    "approve": _decide("approve"),
    "reject": _decide("reject"),
    "triggers": _worker_tool("list_triggers"),
    "pause": _worker_tool("pause_worker"),
    "resume": _worker_tool("resume_worker"),
    "secrets": _secrets,
    "deploy": lambda w: "deploy_worker(files={...})",
    "validate": lambda w: "validate_worker(files={...})",
    "handoffs": _handoffs,
}


def _retell(match: re.Match[str]) -> str:
    try:
        words = shlex.split(match.group(1))
    except ValueError:
        return match.group(0)
    render = _TOOLS.get(words[0]) if words else None
    # Placeholders in the CLI's spelling ({name} already filled in) read as arguments.
    return match.group(0) if render is None else render(words[1:])


def for_mcp(text: str | None) -> str | None:
    """`text` with each CLI command that has an MCP tool replaced by that tool's call."""
    return _COMMAND.sub(_retell, text) if text else text
