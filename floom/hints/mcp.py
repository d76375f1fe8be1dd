"""An action rendered for an agent over MCP: the tool call (and its arguments) that does it.

An agent over HTTP has no `floom` binary. An operation no tool does (key, agent and role
administration, starting or backing up a server) stays a command, said plainly to be the
operator's: the agent asks them, it cannot run it. Over HTTP each call is scope-aware: a tool
the caller's key may not call says which scope it needs (floom.mcp.server)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from floom.hints import ON_THE_HOST, PLACEHOLDERS, SERVER_COMMANDS, Action, Hint, KeyWith, said
from floom.hints import cli as cli_hints


@dataclass(frozen=True)
class Call:
    """A tool call as a hint writes it: name(arguments)."""

    tool: str
    arguments: tuple[tuple[str, str | bool], ...] = ()
    # What stands for an argument too large to write (a deploy's files).
    shown: str = ""

    def __str__(self) -> str:
        args = [
            f"{k}={v}" if isinstance(v, bool) or v in PLACEHOLDERS else f"{k}={v!r}"
            for k, v in self.arguments
        ]
        return f"{self.tool}({', '.join(([self.shown] if self.shown else []) + args)})"


def _call(tool: str, **arguments: str | bool) -> Call:
    return Call(tool, tuple(arguments.items()))


def _on_worker(tool: str) -> Callable[[Action], Call]:
    return lambda a: _call(tool, worker=a.arg("worker"))


def _on_run(tool: str) -> Callable[[Action], Call]:
    return lambda a: _call(tool, run_id=a.arg("run_id"))


def _rollback(a: Action) -> Call:
    if a.has("run_id"):
        return _call("rollback_worker", worker=a.arg("worker"), run_id=a.arg("run_id"))
    return _call("rollback_worker", worker=a.arg("worker"), version_id=a.arg("version"))


def _replay(a: Action) -> Call:
    run = a.arg("run_id")
    if a.flag("exact"):
        return _call("replay_recorded_run", run_id=run, mode="exact")
    if a.has("version"):
        return _call("replay_recorded_run", run_id=run, mode="what_if", version_id=a.arg("version"))
    if a.has("model"):
        return _call("replay_recorded_run", run_id=run, mode="what_if", model=a.arg("model"))
    if a.flag("latest"):
        return _call("replay_run", run_id=run, latest=True)
    return _call("replay_run", run_id=run)


def _eval(a: Action) -> Call:
    if a.has("version"):
        return _call("eval_worker", worker=a.arg("worker"), version_id=a.arg("version"))
    return _call("eval_worker", worker=a.arg("worker"))


def _deploy(a: Action) -> Call:
    extra = {"skip_eval_gate": True} if a.flag("skip_eval_gate") else {}
    return Call("deploy_worker", tuple(extra.items()), shown="files={...}")


TOOLS: dict[str, Callable[[Action], Call]] = {
    "workers": lambda a: _call("list_workers"),
    "deploy": _deploy,
    "versions": _on_worker("list_versions"),
    "rollback": _rollback,
    "pause": _on_worker("pause_worker"),
    "resume": _on_worker("resume_worker"),
    "triggers": _on_worker("list_triggers"),
    "state get": _on_worker("get_worker_state"),
    "state history": _on_worker("list_worker_state_versions"),
    "state set": _on_worker("set_worker_state"),
    "eval": _eval,
    "run": lambda a: (
        _call("run_worker", worker=a.arg("worker"), force=True)
        if a.flag("force")
        else _call("run_worker", worker=a.arg("worker"))
    ),
    "runs": lambda a: (
        _call("list_runs", worker=a.arg("worker")) if a.has("worker") else _call("list_runs")
    ),
    "runs show": _on_run("get_run"),
    "show": _on_run("get_run"),
    "logs": _on_run("get_run_logs"),
    "replay": _replay,
    "approvals": lambda a: _call("list_approvals"),
    "approve": lambda a: _call(
        "decide_approval", approval_id=a.arg("approval_id"), decision="approve"
    ),
    "reject": lambda a: _call(
        "decide_approval", approval_id=a.arg("approval_id"), decision="reject", comment="WHY"
    ),
    "secrets list": lambda a: _call("list_secrets"),
    "secrets set": lambda a: _call("set_secret", name=a.arg("name"), value="VALUE"),
    "secrets rm": lambda a: _call("delete_secret", name=a.arg("name")),
    "handoffs list": lambda a: _call("handoff_list_jobs"),
    "handoffs claim-next": lambda a: _call("handoff_claim_next_job"),
    "alerts channels": lambda a: _call("list_alert_channels"),
    "alerts channels add": lambda a: Call("add_alert_channel", shown="..."),
    "alerts channels rm": lambda a: _call("list_alert_channels"),
    "alerts rules": lambda a: _call("list_alert_rules"),
    "alerts deliveries": lambda a: _call("list_alert_deliveries"),
}
# Operations no tool does: the operator's, or the stdio server itself (named where it is
# explained, on the agent's own machine).
NO_TOOL = frozenset(set(cli_hints.OPS) - set(TOOLS))


def action(a: Action, lacked: Callable[[str], str | None] | None = None) -> str:
    """The tool call that does `a`; with `lacked`, a tool the caller's key may not call says
    the scope it needs. An operation no tool does is the operator's command, said so."""
    render = TOOLS.get(a.op)
    if render is None:
        if a.op == "mcp":
            return cli_hints.command(a)
        line = cli_hints.line(a)
        if line[0] in SERVER_COMMANDS:
            return said(line, f"{ON_THE_HOST}; no MCP tool does it")
        return said(line, "a command of the floom CLI for floom's operator; no MCP tool does it")
    call = render(a)
    scope = lacked(call.tool) if lacked is not None else None
    if scope is None:
        return str(call)
    return f"{call} (a tool for a key with the '{scope}' scope, which this key lacks)"


def key(needed: KeyWith) -> str:
    """A key to use, as an agent's MCP client takes it: in its configuration (keys are made by
    floom's operator, as no tool does it)."""
    return (
        f"an API key with the '{needed.scope}' scope (or higher): configure this MCP client "
        "with one"
    )


def render(told: Hint | None, lacked: Callable[[str], str | None] | None = None) -> str | None:
    return told.render(lambda a: action(a, lacked), key) if told is not None else None
