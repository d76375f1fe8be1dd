"""http_request across a redirect to another origin: a header or body that carried a secret
(a ${NAME} placeholder filled in) is not handed to it, whatever the header's name; the
first origin alone chose where the request goes next (the real anthropic SDK against the
Messages stand-in, the echo service as two allowed hosts)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.anthropic_api import reply, tool_use
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status

TOKEN = "hop-secret-5150"
CALLER_YML = """\
name: caller
secrets: [HOP_TOKEN]
tools:
  - builtin: http_request
    allow_domains: ["*.example.test"]
"""


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    resolve = "api.example.test=127.0.0.1,other.example.test=127.0.0.1"
    with agent_rig(tmp_path / "data", database_url, agent_http_resolve=resolve) as r:
        r.deploy(agent_worker(tmp_path / "caller", CALLER_YML))
        r.api.put("/api/v1/secrets/HOP_TOKEN", json={"value": TOKEN})
        yield r


def test_secret_headers_and_bodies_are_not_sent_on_to_another_origin(rig: AgentRig) -> None:
    port = rig.echo["port"]
    other = f"http://other.example.test:{port}/landed"
    same = rig.url("/landed-here")
    headers = {"X-Api-Key": "${HOP_TOKEN}", "X-Plain": "kept", "Authorization": "k ${HOP_TOKEN}"}
    rig.model.script(
        reply(
            tool_use("http_request", {"url": rig.url(f"/redirect?to={other}"), "headers": headers}),
            tool_use(
                "http_request",
                {
                    "method": "POST",
                    "url": rig.url(f"/redirect?status=307&to={other}"),
                    "json": {"key": "${HOP_TOKEN}"},
                },
            ),
            tool_use("http_request", {"url": rig.url(f"/redirect?to={same}"), "headers": headers}),
        ),
        reply(tool_use("finish", {"outputs": {}})),
    )
    run = wait_status(rig.api, start_run(rig.api, "caller"))

    assert run["status"] == "succeeded", run
    landed = [r for r in rig.echo["requests"] if r["path"] == "/landed"]
    # The 307 would resend the body that carries the secret: refused, not followed.
    body_hop = run["tool_calls"][1]
    assert body_hop["status"] == "error", body_hop
    assert "another origin" in body_hop["error"]
    (hop,) = landed
    assert hop["method"] == "GET"
    assert "x-api-key" not in hop["headers"]
    assert "authorization" not in hop["headers"]
    assert hop["headers"]["x-plain"] == "kept"
    assert TOKEN not in json.dumps(landed)
    # Within the origin the secret goes on, as asked.
    (here,) = [r for r in rig.echo["requests"] if r["path"] == "/landed-here"]
    assert here["headers"]["x-api-key"] == TOKEN
