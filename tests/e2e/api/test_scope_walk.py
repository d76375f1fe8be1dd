"""Every /api/v1 route called with a key of each scope, plain and an agent's, and every page
and form of the web UI with a session of each: each answer refuses (403) or not exactly as
the route's row says (ROUTE_SCOPES in test_authorization.py, UI_SCOPES here), so a route
whose enforcement drifts from its row fails, not only one whose declared dependency does;
and a UI session is no key for the API. One server; harmless bodies (empty, or ids that name
nothing), so what an admitted call changes is at most a replay or a pause."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from floom.services.access import keys
from floom.services.access.principal import SCOPES, SYSTEM, grants
from floom.services.context import Context
from floom.services.handoffs import jobs as handoff_jobs
from tests.e2e.api.test_authorization import EXPOSED_YML, ROUTE_SCOPES, TOOL_SCOPES
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    fast_settings,
    make_worker,
    wait_for_run,
)
from tests.support.mcp_clients import http_client
from tests.support.rigs.handoffs import agent_keys_by_scope
from tests.support.web import csrf_of, signed_in_client

# Handoff routes read and act as an agent: a key of no agent is refused on them whatever its
# scope, unless it is an admin's (which sees and moves every job); publishing a job is open
# to any key with `run` (the key is its source), and the transition table to any reader.
AGENT_OR_ADMIN = {
    "GET /api/v1/agents/me",
    "POST /api/v1/handoffs/claim-next",
    "GET /api/v1/handoffs/jobs",
    "GET /api/v1/handoffs/jobs/{job_id}",
    "PATCH /api/v1/handoffs/jobs/{job_id}",
    "POST /api/v1/handoffs/jobs/{job_id}/claim",
    "POST /api/v1/handoffs/jobs/{job_id}/complete",
    "GET /api/v1/handoffs/jobs/{job_id}/events",
    "POST /api/v1/handoffs/jobs/{job_id}/heartbeat",
    "POST /api/v1/handoffs/jobs/{job_id}/reject",
    "GET /api/v1/handoffs/jobs/{job_id}/reopen-context",
    "POST /api/v1/handoffs/jobs/{job_id}/status",
    "GET /api/v1/handoffs/me",
}
# Only an agent holds a job: an admin's key of no agent is refused too. (Claiming a job by
# id is refused as well, after the job is found: here it names none, so 404.)
AGENT_ONLY = {"POST /api/v1/handoffs/claim-next"}
# Every page and form of the web UI and the scope it needs, as its REST twin's row says. A
# new page fails the walk until it is added here. Sign-in and sign-out are walked elsewhere
# (tests/e2e/web); sessions here stay signed in.
UI_SCOPES: dict[str, str] = {
    "GET /": "read",
    "GET /alerts": "read",
    "POST /alerts/channels": "deploy",
    "POST /alerts/channels/{name}/delete": "deploy",
    "POST /alerts/channels/{name}/test": "deploy",
    "POST /alerts/deliveries/{delivery_id}/resend": "deploy",
    "POST /alerts/rules": "deploy",
    "POST /alerts/rules/{name}/delete": "deploy",
    "POST /alerts/rules/{name}/{action}": "deploy",
    "GET /approvals": "read",
    "POST /approvals/{approval_id}/approve": "run",
    "POST /approvals/{approval_id}/reject": "run",
    "GET /evals/{eval_id}": "read",
    # The board answers every reader: a key of no agent is told there how to take part.
    "GET /handoffs": "read",
    "GET /handoffs/jobs/{job_id}": "read",
    "POST /handoffs/jobs/{job_id}/reject": "run",
    "POST /handoffs/jobs/{job_id}/status": "run",
    "GET /keys": "admin",
    "POST /keys": "admin",
    "POST /keys/{key_id}/revoke": "admin",
    "GET /nodes": "read",
    "GET /replays/{run_id}": "read",
    "GET /runs": "read",
    "GET /runs/{run_id}": "read",
    "GET /runs/{run_id}/artifacts/{name:path}": "read",
    "POST /runs/{run_id}/cancel": "run",
    "GET /runs/{run_id}/files/{name:path}": "read",
    "GET /runs/{run_id}/logs/stream": "read",
    "POST /runs/{run_id}/replay": "run",
    "POST /runs/{run_id}/replays": "run",
    "POST /runs/{run_id}/rollback": "deploy",
    "GET /secrets": "deploy",
    "POST /secrets": "deploy",
    "POST /secrets/{name}/delete": "deploy",
    "GET /workers/{name}": "read",
    "POST /workers/{name}/delete": "deploy",
    "GET /workers/{name}/diff": "read",
    "POST /workers/{name}/evals": "run",
    "POST /workers/{name}/pause": "deploy",
    "POST /workers/{name}/resume": "deploy",
    "POST /workers/{name}/rollback": "deploy",
    "POST /workers/{name}/runs": "run",
    "POST /workers/{name}/state": "deploy",
}
UI_AGENT_OR_ADMIN = {
    "GET /handoffs/jobs/{job_id}",
    "POST /handoffs/jobs/{job_id}/reject",
    "POST /handoffs/jobs/{job_id}/status",
}
SIGN_IN = {"GET /login", "POST /login", "POST /logout"}
# A worker and a run of it, so the forms reach their rule: with names that name nothing,
# some pages answer 404 before the scope is asked (the page of the run they would show).
WALKED_YML = """\
name: walked
inputs:
  text: {type: string, required: true}
"""
# Bodies that pass validation, where an empty one would be refused before the rule the walk
# checks; each still names nothing, so nothing changes.
BODIES: dict[str, dict[str, Any]] = {
    "POST /api/v1/handoffs/jobs/{job_id}/status": {"status": "blocked"},
    "POST /api/v1/handoffs/jobs/{job_id}/reject": {"reason": "walked"},
}


def _call(client: httpx.Client, route: str, **extra: Any) -> httpx.Response:
    method, path = route.split(" ", 1)
    url = re.sub(r"\{[^}]+\}", "nope-0", path)
    body = BODIES.get(route, {})
    return client.request(method, url, json=body, params={"wait": 0}, **extra)


def _code(resp: httpx.Response) -> str | None:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _allowed(held: str, needed: str, *, agent: bool, agents_or_admins: bool) -> bool:
    if agent or held == "admin":
        return grants([held], needed)
    return grants([held], needed) and not agents_or_admins


def _walk(client: httpx.Client, held: str, *, agent: bool, wrong: list[str]) -> None:
    who = f"{'an agent' if agent else 'a'} {held} key"
    for route, needed in ROUTE_SCOPES.items():
        resp = _call(client, route)
        allowed = _allowed(held, needed, agent=agent, agents_or_admins=route in AGENT_OR_ADMIN)
        if route in AGENT_ONLY and not agent:
            allowed = False
        refused = resp.status_code == 403
        if refused != (not allowed):
            wrong.append(f"{route} with {who}: {resp.status_code} {_code(resp)}, needs {needed}")
        elif refused and _code(resp) != "forbidden":
            wrong.append(f"{route} with {who} refused as {_code(resp)}, not forbidden")


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[Context]:
    """One store is enough (the rule is above it), and no limit on requests without a key:
    the sessions' walk makes hundreds from one address."""
    url = f"sqlite:///{tmp_path / 'floom.db'}"
    settings = fast_settings(tmp_path / "data", url, anonymous_rate_limit_per_minute=0)
    context = Context.open(settings)
    yield context
    context.engine.dispose()


def test_each_route_refuses_exactly_the_keys_and_sessions_its_row_refuses(
    server: LiveServer,
) -> None:
    agents = agent_keys_by_scope(server.ctx, "walker")
    plain = {s: keys.create_key(server.ctx, caller=SYSTEM, scopes=[s], name=s)[1] for s in SCOPES}
    wrong: list[str] = []
    with ExitStack() as stack:
        for held in SCOPES:
            _walk(
                stack.enter_context(server.client(key=plain[held])), held, agent=False, wrong=wrong
            )
            _walk(
                stack.enter_context(server.client(key=agents[held])), held, agent=True, wrong=wrong
            )
    # A UI session (its cookie, and its CSRF token as the UI's forms send it) stands for the
    # key it was opened with only on the UI's own pages: a page of another site that makes a
    # browser call the API gets no further than a caller without a key, whatever the scope.
    for held in SCOPES:
        browser = signed_in_client(server, plain[held])
        csrf = csrf_of(browser.get("/").text)
        for route in ROUTE_SCOPES:
            resp = _call(browser, route, headers={"X-CSRF-Token": csrf})
            if (resp.status_code, _code(resp)) != (401, "unauthorized"):
                wrong.append(f"{route} with a {held} session: {resp.status_code} {_code(resp)}")
    assert wrong == [], "\n".join(wrong)


def _ui_routes() -> list[str]:
    from fastapi import FastAPI

    from floom.ui import app as ui
    from floom.ui.support import UiRoute

    app = FastAPI()
    ui.install(app)
    return sorted(
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, UiRoute)
        for method in route.methods or ()
        if method != "HEAD"
    )


def test_every_ui_page_and_form_has_a_row() -> None:
    walked = set(_ui_routes()) - SIGN_IN
    assert sorted(walked - set(UI_SCOPES)) == [], "UI routes with no row in UI_SCOPES"
    assert sorted(set(UI_SCOPES) - walked) == [], "rows of UI_SCOPES with no route"


def test_each_ui_page_and_form_refuses_exactly_the_sessions_its_row_refuses(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as api:
        deploy_folder(api, make_worker(tmp_path / "walked", WALKED_YML, {"run.py": "pass\n"}))
        started = api.post("/api/v1/workers/walked/runs", json={"inputs": {"text": "x"}})
        run_id = started.json()["id"]
        wait_for_run(api, run_id)
    agents = agent_keys_by_scope(server.ctx, "walker")
    job_id = handoff_jobs.create_job(server.ctx, actor=SYSTEM, summary="s", role="walker").row.id
    wrong: list[str] = []
    for held in SCOPES:
        plain = keys.create_key(server.ctx, caller=SYSTEM, scopes=[held], name=f"ui {held}")[1]
        for key, is_agent in ((plain, False), (agents[held], True)):
            who = f"{'an agent' if is_agent else 'a'} {held} session"
            browser = signed_in_client(server, key)  # closed with the server's clients
            csrf = csrf_of(browser.get("/").text)
            for route, needed in UI_SCOPES.items():
                method, path = route.split(" ", 1)
                url = path.replace("{name}", "walked").replace("{run_id}", run_id)
                url = url.replace("{job_id}", job_id)
                url = re.sub(r"\{[^}]+\}", "nope-0", url.replace("{action}", "disable"))
                form = {"csrf": csrf} if method == "POST" else None
                resp = browser.request(method, url, data=form, follow_redirects=False)
                allowed = _allowed(
                    held, needed, agent=is_agent, agents_or_admins=route in UI_AGENT_OR_ADMIN
                )
                if (resp.status_code == 403) == allowed:
                    wrong.append(f"{route} with {who}: {resp.status_code}, needs {needed}")
                if resp.headers.get("location", "").startswith("/login"):
                    wrong.append(f"{route} with {who} was sent to sign in")
    assert wrong == [], "\n".join(wrong)


# The MCP tools that read or act as an agent (test_authorization.py's TOOL_SCOPES names the
# scope of each): a key of no agent is refused on them whatever its scope, unless an admin's.
TOOL_AGENT_OR_ADMIN = {
    "handoff_claim_job",
    "handoff_claim_next_job",
    "handoff_complete_job",
    "handoff_get_job",
    "handoff_heartbeat",
    "handoff_list_jobs",
    "handoff_my_roles",
    "handoff_reject_job",
    "handoff_reopen_context",
    "handoff_set_status",
    "handoff_update_job",
}
TOOL_AGENT_ONLY = {"handoff_claim_next_job"}
# Arguments that pass validation (a job that is not there), so the rule is reached.
_NO_JOB = {"job_id": "nope-0"}
TOOL_ARGS: dict[str, dict[str, Any]] = {
    **dict.fromkeys(
        "handoff_claim_job handoff_get_job handoff_heartbeat "
        "handoff_reopen_context handoff_update_job".split(),
        _NO_JOB,
    ),
    "handoff_complete_job": {**_NO_JOB, "summary": "walked"},
    "handoff_reject_job": {**_NO_JOB, "reason": "walked"},
    "handoff_set_status": {**_NO_JOB, "status": "blocked"},
}


def test_each_mcp_tool_refuses_exactly_the_plain_keys_its_row_refuses(
    server: LiveServer, tmp_path: Path
) -> None:
    with server.client() as api:
        deploy_folder(api, make_worker(tmp_path / "walked", EXPOSED_YML, {"run.py": "pass\n"}))
    tools = {**TOOL_SCOPES, "walked": "run"}  # a worker exposed as a tool needs `run`
    plain = {s: keys.create_key(server.ctx, caller=SYSTEM, scopes=[s], name=s)[1] for s in SCOPES}
    wrong: list[str] = []

    async def walk() -> None:
        for held in SCOPES:
            async with http_client(server, plain[held]) as mcp:
                for name, needed in tools.items():
                    result = await mcp.call_tool(name, TOOL_ARGS.get(name, {}))
                    error = (result.structured_content or {}).get("error") or {}
                    allowed = (
                        _allowed(
                            held, needed, agent=False, agents_or_admins=name in TOOL_AGENT_OR_ADMIN
                        )
                        and name not in TOOL_AGENT_ONLY
                    )
                    refused = error.get("code") == "forbidden"
                    if refused == allowed:
                        wrong.append(
                            f"{name} with a {held} key: {error.get('code')}, needs {needed}"
                        )

    anyio.run(walk)
    assert wrong == [], "\n".join(wrong)
