"""An action rendered for a plain REST client: the request (method and path, and the body
where it matters) that does it. Such a client may have no `floom` binary; floom's own CLI says
so in its X-Floom-Client header and gets the commands. An operation with no endpoint (starting
a server, backups, store migrations) stays a command, said plainly to be run on the server's
host."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from floom.hints import ON_THE_HOST, PLACEHOLDERS, SERVER_COMMANDS, Action, Hint, KeyWith, said
from floom.hints import cli as cli_hints

API = "/api/v1"


@dataclass(frozen=True)
class Request:
    """A REST request as a hint writes it: `METHOD /api/v1/path {body}` and what follows."""

    method: str
    path: str
    body: str = ""
    after: str = ""

    def __str__(self) -> str:
        return f"`{self.method} {API}/{self.path}{self.body}`{self.after}"


def _path(*parts: str) -> str:
    # Placeholders stay readable (WORKER); real names are percent-encoded as the route wants.
    return "/".join(p if p in PLACEHOLDERS else quote(p, safe="") for p in parts)


def _request(method: str, *parts: str, body: Mapping[str, object] | None = None) -> Request:
    return Request(method, _path(*parts), f" {json.dumps(body)}" if body else "")


def _on_worker(method: str, *after: str) -> Callable[[Action], Request]:
    return lambda a: _request(method, "workers", a.arg("worker"), *after)


def _on_run(method: str, *after: str) -> Callable[[Action], Request]:
    return lambda a: _request(method, "runs", a.arg("run_id"), *after)


def _run(a: Action) -> Request:
    body: dict[str, object] = {"inputs": {}}
    if a.flag("force"):
        body["force"] = True
    return _request("POST", "workers", a.arg("worker"), "runs", body=body)


def _rollback(a: Action) -> Request:
    run = a.has("run_id")
    body = {"run_id": a.arg("run_id")} if run else {"version_id": a.arg("version")}
    return _request("POST", "workers", a.arg("worker"), "rollback", body=body)


def _replay(a: Action) -> Request:
    run = a.arg("run_id")
    if a.flag("exact"):
        return _request("POST", "runs", run, "replays", body={"mode": "exact"})
    if a.has("version"):
        body = {"mode": "what_if", "version_id": a.arg("version")}
        return _request("POST", "runs", run, "replays", body=body)
    if a.has("model"):
        return _request(
            "POST", "runs", run, "replays", body={"mode": "what_if", "model": a.arg("model")}
        )
    if a.flag("latest"):
        return _request("POST", "runs", run, "replay", body={"latest": True})
    return _request("POST", "runs", run, "replay")


def _eval(a: Action) -> Request:
    body = {"version_id": a.arg("version")} if a.has("version") else {}
    return _request("POST", "workers", a.arg("worker"), "evals", body=body)


def _deploy(a: Action) -> Request:
    query = "?skip_eval_gate=true" if a.flag("skip_eval_gate") else ""
    return Request("POST", f"workers{query}", after=" (the folder as a tar.gz body)")


def _runs(a: Action) -> Request:
    if a.has("worker"):
        return Request("GET", f"runs?worker={quote(a.arg('worker'))}")
    return _request("GET", "runs")


def _agents_create(a: Action) -> Request:
    body = {"label": a.arg("name"), "roles": [a.arg("role")]}
    then = _request("POST", "agents", "NAME", "keys")
    return Request("POST", "agents", f" {json.dumps(body)}", f" (then {then})")


ENDPOINTS: dict[str, Callable[[Action], Request]] = {
    "workers": lambda a: _request("GET", "workers"),
    "deploy": _deploy,
    "versions": _on_worker("GET", "versions"),
    "rollback": _rollback,
    "pause": _on_worker("POST", "pause"),
    "resume": _on_worker("POST", "resume"),
    "triggers": _on_worker("GET", "triggers"),
    "deliveries": _on_worker("GET", "deliveries"),
    "state get": _on_worker("GET", "state"),
    "state history": _on_worker("GET", "state", "versions"),
    "state set": lambda a: _request(
        "PUT", "workers", a.arg("worker"), "state", body={"state": "..."}
    ),
    "eval": _eval,
    "run": _run,
    "runs": _runs,
    "runs show": _on_run("GET"),
    "show": _on_run("GET"),
    "logs": lambda a: _on_run("GET", *(("logs", "stream") if a.flag("follow") else ("logs",)))(a),
    "replay": _replay,
    "approvals": lambda a: _request("GET", "approvals"),
    "approve": lambda a: _request("POST", "approvals", a.arg("approval_id"), "approve"),
    "reject": lambda a: _request(
        "POST", "approvals", a.arg("approval_id"), "reject", body={"comment": "WHY"}
    ),
    "secrets list": lambda a: _request("GET", "secrets"),
    "secrets set": lambda a: _request("PUT", "secrets", a.arg("name"), body={"value": "VALUE"}),
    "secrets rm": lambda a: _request("DELETE", "secrets", a.arg("name")),
    "keys list": lambda a: _request("GET", "keys"),
    "keys create": lambda a: _request("POST", "keys", body={"scopes": [a.arg("scope")]}),
    "agents list": lambda a: _request("GET", "agents"),
    "agents create": _agents_create,
    "roles list": lambda a: _request("GET", "roles"),
    "handoffs list": lambda a: _request("GET", "handoffs", "jobs"),
    "handoffs claim-next": lambda a: _request("POST", "handoffs", "claim-next"),
    "alerts channels": lambda a: _request("GET", "alerts", "channels"),
    "alerts channels add": lambda a: _request("POST", "alerts", "channels"),
    "alerts channels rm": lambda a: _request("DELETE", "alerts", "channels", a.arg("name")),
    "alerts rules": lambda a: _request("GET", "alerts", "rules"),
    "alerts deliveries": lambda a: _request("GET", "alerts", "deliveries"),
    "nodes": lambda a: _request("GET", "nodes"),
}
# Operations no endpoint does: the server host's, or the stdio MCP server (named where it is
# explained).
NO_ENDPOINT = frozenset(set(cli_hints.OPS) - set(ENDPOINTS))


def action(a: Action, lacked: Callable[[Request], str | None] | None = None) -> str:
    """The request that does `a`; with `lacked`, a request the caller's key may not make says
    the scope it needs. An operation of the server's host is said to be one."""
    render = ENDPOINTS.get(a.op)
    if render is None:
        line = cli_hints.line(a)
        if line[0] in SERVER_COMMANDS:
            return said(line, f"{ON_THE_HOST}; no endpoint does it")
        return cli_hints.command(a)
    request = render(a)
    scope = lacked(request) if lacked is not None else None
    if scope is None:
        return str(request)
    return f"{request} (a request for a key with the '{scope}' scope, which this key lacks)"


def key(needed: KeyWith, lacked: Callable[[Request], str | None] | None = None) -> str:
    """A key to use, as a REST client gets one: the request that creates it."""
    made = action(cli_hints.act("keys create", scope=needed.scope), lacked)
    return f"a key created with {made} (or higher)"


def render(told: Hint | None, lacked: Callable[[Request], str | None] | None = None) -> str | None:
    if told is None:
        return None
    return told.render(lambda a: action(a, lacked), lambda k: key(k, lacked))
