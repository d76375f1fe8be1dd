"""Every /api/v1 route called with a key of each scope, plain and an agent's, and with each
UI session: each answer refuses (403) or not exactly as the route's row in ROUTE_SCOPES
says (test_authorization.py), so a route whose enforcement drifts from its row fails, not
only one whose declared dependency does. One server; harmless bodies (empty, ids that name
nothing), so nothing is made or changed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.services.access import keys
from floom.services.access.principal import SCOPES, SYSTEM, grants
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from tests.e2e.api.test_authorization import ROUTE_SCOPES
from tests.support.harness import LiveServer, fast_settings
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


def _walk(client: httpx.Client, held: str, *, agent: bool, wrong: list[str]) -> None:
    who = f"{'an agent' if agent else 'a'} {held} key"
    for route, needed in ROUTE_SCOPES.items():
        resp = _call(client, route)
        if agent:
            allowed = grants([held], needed)
        elif route in AGENT_ONLY:
            allowed = False
        else:
            allowed = grants([held], needed) and (held == "admin" or route not in AGENT_OR_ADMIN)
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
    handoff_agents.create_role(server.ctx, caller=SYSTEM, name="walker")
    agent = handoff_agents.create_agent(server.ctx, caller=SYSTEM, label="walker", roles=["walker"])
    plain = {s: keys.create_key(server.ctx, caller=SYSTEM, scopes=[s], name=s)[1] for s in SCOPES}
    agents = {
        s: handoff_agents.create_agent_key(
            server.ctx, caller=SYSTEM, agent=agent.agent.id, scopes=[s]
        )[1]
        for s in SCOPES
    }
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
