"""Hints written for a person at a shell, retold for an agent over MCP: each `floom ...` CLI
command a hint or message names becomes the MCP tool (and its arguments) that does the same.

An agent over HTTP has no `floom` binary, so the services' hints, which name CLI commands,
are translated here, at the one place errors become tool errors. A command no tool does (key,
agent and role administration, starting or backing up a server) stays a command, said plainly
to be the operator's: the agent asks them, it cannot run it.
"""

from __future__ import annotations

from collections.abc import Callable

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


def _call(tool: str, **arguments: str | bool) -> str:
    args = ", ".join(
        f"{k}={v}" if isinstance(v, bool) or v in PLACEHOLDERS else f"{k}={v!r}"
        for k, v in arguments.items()
    )
    return f"{tool}({args})"


def _runs(words: list[str]) -> str:
    if words[:1] == ["show"]:
        return _call("get_run", run_id=first(words[1:], "RUN_ID"))
    if "--worker" in words:
        return _call("list_runs", worker=option(words, "--worker", "WORKER"))
    return "list_runs()"


def _workers(words: list[str]) -> str:
    if words[:1] == ["delete"]:
        return _call("delete_worker", worker=first(words[1:], "WORKER"), confirm=True)
    return "list_workers()"


def _secrets(words: list[str]) -> str:
    if words[:1] == ["set"]:
        return _call("set_secret", name=first(words[1:], "NAME"), value="VALUE")
    return "list_secrets()"


def _handoffs(words: list[str]) -> str:
    if words[:1] == ["claim-next"]:
        return "handoff_claim_next_job()"
    return "handoff_list_jobs()"


def _rollback(words: list[str]) -> str:
    worker = first(words, "WORKER")
    if "--run" in words:
        return _call("rollback_worker", worker=worker, run_id=option(words, "--run", "RUN_ID"))
    return _call("rollback_worker", worker=worker, version_id=option(words, "--to", "VERSION"))


def _state(words: list[str]) -> str:
    worker = first(words[1:], "WORKER")
    if words[:1] == ["history"]:
        return _call("list_worker_state_versions", worker=worker)
    if words[:1] == ["set"]:
        return _call("set_worker_state", worker=worker, state="VALUE")
    return _call("get_worker_state", worker=worker)


def _replay(words: list[str]) -> str:
    run = first(words, "RUN_ID")
    if "--exact" in words:
        return _call("replay_recorded_run", run_id=run, mode="exact")
    if "--against" in words:
        version = option(words, "--against", "VERSION")
        return _call("replay_recorded_run", run_id=run, mode="what_if", version_id=version)
    if "--model" in words:
        model = option(words, "--model", "MODEL")
        return _call("replay_recorded_run", run_id=run, mode="what_if", model=model)
    return _call("replay_run", run_id=run)


def _eval(words: list[str]) -> str:
    if "--against" in words:
        version = option(words, "--against", "VERSION")
        return _call("eval_worker", worker=first(words, "WORKER"), version_id=version)
    return _call("eval_worker", worker=first(words, "WORKER"))


def _decide(decision: str) -> Render:
    def render(words: list[str]) -> str:
        approval = first(words, "APPROVAL_ID")
        if decision == "reject":
            return _call("decide_approval", approval_id=approval, decision="reject", comment="WHY")
        return _call("decide_approval", approval_id=approval, decision="approve")

    return render


def _worker_tool(tool: str) -> Callable[[list[str]], str]:
    return lambda words: _call(tool, worker=first(words, "WORKER"))


def _run_tool(tool: str) -> Callable[[list[str]], str]:
    return lambda words: _call(tool, run_id=first([w for w in words if w != "-f"], "RUN_ID"))


_TOOLS: dict[str, Render] = {
    "workers": _workers,
    "versions": _worker_tool("list_versions"),
    "rollback": _rollback,
    "runs": _runs,
    "show": _run_tool("get_run"),
    "logs": _run_tool("get_run_logs"),
    "artifacts": lambda w: (
        _call("get_artifact", run_id=first(w, "RUN_ID"), name=option(w, "--download", "NAME"))
        if "--download" in w
        else _call("get_run", run_id=first(w, "RUN_ID"))
    ),
    "run": lambda w: (
        _call("run_worker", worker=first(w, "WORKER"), force=True)
        if "--force" in w
        else _call("run_worker", worker=first(w, "WORKER"))
    ),
    "replay": _replay,
    "eval": _eval,
    "approvals": lambda w: "list_approvals()",
    "approve": _decide("approve"),
    "reject": _decide("reject"),
    "triggers": _worker_tool("list_triggers"),
    "pause": _worker_tool("pause_worker"),
    "resume": _worker_tool("resume_worker"),
    "secrets": _secrets,
    "state": _state,
    "deploy": lambda w: (
        "deploy_worker(files={...}, skip_eval_gate=True)"
        if "--skip-eval-gate" in w
        else "deploy_worker(files={...})"
    ),
    "validate": lambda w: "validate_worker(files={...})",
    "handoffs": _handoffs,
    "cancel": _run_tool("cancel_run"),
    # Named where it already says what it is: the server on the agent's own machine.
    "mcp": lambda w: None,
}


def _not_a_tool(words: list[str]) -> str:
    if words[0] in SERVER_COMMANDS:
        return said(words, f"{ON_THE_HOST}; no MCP tool does it")
    return said(words, "a command of the floom CLI for floom's operator; no MCP tool does it")


def for_mcp(text: str | None) -> str | None:
    """`text` with each CLI command that has an MCP tool replaced by that tool's call, and
    each other one said to be the operator's."""
    return retell(text, _TOOLS, otherwise=_not_a_tool)
