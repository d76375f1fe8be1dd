"""Hints retold for a plain REST client: each `floom ...` CLI command a message or hint
names becomes the REST request (method and path, and the body where it matters) that does
the same. Such a client may have no `floom` binary; floom's own CLI says so in its
X-Floom-Client header and keeps the commands. A command with no endpoint (starting a server,
backups, store migrations) stays a command, said plainly to be run on the server's host."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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

API = "/api/v1"


def _path(*parts: str) -> str:
    # Placeholders stay readable (WORKER); real names are percent-encoded as the route wants.
    return "/".join(p if p in PLACEHOLDERS else quote(p, safe="") for p in parts)


def _request(method: str, *parts: str, body: Mapping[str, object] | None = None) -> str:
    said = f"{method} {API}/{_path(*parts)}"
    if body:
        said += f" {json.dumps(body)}"
    return f"`{said}`"


def _runs(words: list[str]) -> str:
    if words[:1] == ["show"]:
        return _request("GET", "runs", first(words[1:], "RUN_ID"))
    if "--worker" in words:
        return f"`GET {API}/runs?worker={quote(option(words, '--worker', 'WORKER'))}`"
    return _request("GET", "runs")


def _workers(words: list[str]) -> str:
    if words[:1] == ["delete"]:
        return _request("DELETE", "workers", first(words[1:], "WORKER"))
    return _request("GET", "workers")


def _run(words: list[str]) -> str:
    body: dict[str, object] = {"inputs": {}}
    if "--force" in words:
        body["force"] = True
    return _request("POST", "workers", first(words, "WORKER"), "runs", body=body)


def _rollback(words: list[str]) -> str:
    worker = first(words, "WORKER")
    if "--run" in words:
        body = {"run_id": option(words, "--run", "RUN_ID")}
    else:
        body = {"version_id": option(words, "--to", "VERSION")}
    return _request("POST", "workers", worker, "rollback", body=body)


def _replay(words: list[str]) -> str:
    run = first(words, "RUN_ID")
    if "--exact" in words:
        return _request("POST", "runs", run, "replays", body={"mode": "exact"})
    if "--against" in words:
        body = {"mode": "what_if", "version_id": option(words, "--against", "VERSION")}
        return _request("POST", "runs", run, "replays", body=body)
    if "--model" in words:
        body = {"mode": "what_if", "model": option(words, "--model", "MODEL")}
        return _request("POST", "runs", run, "replays", body=body)
    return _request("POST", "runs", run, "replay")


def _eval(words: list[str]) -> str:
    body = {"version_id": option(words, "--against", "VERSION")} if "--against" in words else {}
    return _request("POST", "workers", first(words, "WORKER"), "evals", body=body)


def _artifacts(words: list[str]) -> str:
    run = first(words, "RUN_ID")
    if "--download" in words:
        return _request("GET", "runs", run, "artifacts", option(words, "--download", "NAME"))
    return _request("GET", "runs", run, "artifacts")


def _logs(words: list[str]) -> str:
    rest = [w for w in words if w != "-f"]
    stream = ("logs", "stream") if "-f" in words else ("logs",)
    return _request("GET", "runs", first(rest, "RUN_ID"), *stream)


def _decide(words: list[str], decision: str) -> str:
    body = {"comment": "WHY"} if decision == "reject" else None
    return _request("POST", "approvals", first(words, "APPROVAL_ID"), decision, body=body)


def _secrets(words: list[str]) -> str:
    if words[:1] == ["set"]:
        return _request("PUT", "secrets", first(words[1:], "NAME"), body={"value": "VALUE"})
    return _request("GET", "secrets")


def _state(words: list[str]) -> str:
    worker = first(words[1:], "WORKER")
    if words[:1] == ["history"]:
        return _request("GET", "workers", worker, "state", "versions")
    if words[:1] == ["set"]:
        return _request("PUT", "workers", worker, "state", body={"state": "VALUE"})
    return _request("GET", "workers", worker, "state")


def _keys(words: list[str]) -> str:
    if words[:1] == ["create"]:
        return _request("POST", "keys", body={"scopes": [option(words, "--scope", "SCOPE")]})
    return _request("GET", "keys")


def _agents(words: list[str]) -> str:
    if words[:1] == ["create"]:
        body = {"label": first(words[1:], "NAME"), "roles": [option(words, "--role", "ROLE")]}
        return _request("POST", "agents", body=body) + f" (then `POST {API}/agents/NAME/keys`)"
    return _request("GET", "agents")


def _roles(words: list[str]) -> str:
    if words[:1] == ["create"]:
        return _request("POST", "roles", body={"name": first(words[1:], "NAME")})
    return _request("GET", "roles")


def _handoffs(words: list[str]) -> str:
    if words[:1] == ["claim-next"]:
        return _request("POST", "handoffs", "claim-next")
    return _request("GET", "handoffs", "jobs")


def _worker_route(method: str, *after: str) -> Callable[[list[str]], str]:
    return lambda words: _request(method, "workers", first(words, "WORKER"), *after)


def _run_route(method: str, *after: str) -> Callable[[list[str]], str]:
    return lambda words: _request(method, "runs", first(words, "RUN_ID"), *after)


_ENDPOINTS: dict[str, Render] = {
    "workers": _workers,
    "deploy": lambda w: (
        f"`POST {API}/workers?skip_eval_gate=true` (the folder as a tar.gz body)"
        if "--skip-eval-gate" in w
        else f"`POST {API}/workers` (the folder as a tar.gz body)"
    ),
    "validate": lambda w: f"`POST {API}/workers/validate` (the folder as a tar.gz body)",
    "versions": _worker_route("GET", "versions"),
    "rollback": _rollback,
    "run": _run,
    "runs": _runs,
    "show": _run_route("GET"),
    "logs": _logs,
    "artifacts": _artifacts,
    "cancel": _run_route("POST", "cancel"),
    "replay": _replay,
    "eval": _eval,
    "triggers": _worker_route("GET", "triggers"),
    "pause": _worker_route("POST", "pause"),
    "resume": _worker_route("POST", "resume"),
    "deliveries": _worker_route("GET", "deliveries"),
    "replay-delivery": lambda w: _request("POST", "deliveries", first(w, "ID"), "replay"),
    "approvals": lambda w: _request("GET", "approvals"),
    "approve": lambda w: _decide(w, "approve"),
    "reject": lambda w: _decide(w, "reject"),
    "secrets": _secrets,
    "state": _state,
    "keys": _keys,
    "agents": _agents,
    "roles": _roles,
    "handoffs": _handoffs,
    "nodes": lambda w: _request("GET", "nodes"),
}


def _no_endpoint(words: list[str]) -> str | None:
    if words[0] in SERVER_COMMANDS:
        return said(words, f"{ON_THE_HOST}; no endpoint does it")
    return None  # the stdio MCP server, the CLI's own help: named where they are explained


def for_rest(text: str | None) -> str | None:
    """`text` with each CLI command that has an endpoint replaced by that REST request, and
    each command of the server's host said to be one."""
    return retell(text, _ENDPOINTS, otherwise=_no_endpoint)
