"""Agent workers end to end: the real anthropic SDK against the Messages stand-in, the tool
loop, allowlists, address checks, recorded and redacted tool calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.anthropic_api import failure, reply, text, tool_use
from tests.support.rigs.agents import (
    MODEL_KEY,
    AgentRig,
    agent_rig,
    agent_worker,
    log_lines,
    start_run,
    wait_status,
)

TOKEN = "tok-secret-4242"
NOTES_YML = """\
name: notes
inputs: {topic: {type: string, required: true}}
outputs:
  summary: {type: string, required: true}
  count: integer
secrets: [API_TOKEN]
tools:
  - builtin: read_file
  - builtin: list_files
  - builtin: write_file
  - builtin: http_request
    allow_domains: [api.example.test]
"""


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url) as r:
        yield r


def _notes(rig: AgentRig, tmp_path: Path) -> None:
    rig.deploy(
        agent_worker(
            tmp_path / "notes",
            NOTES_YML,
            "Summarise the facts about the topic.",
            **{"data/facts.txt": "fact one\nfact two\n"},
        )
    )
    rig.api.put("/api/v1/secrets/API_TOKEN", json={"value": TOKEN})


def test_an_agent_uses_its_tools_in_a_loop_and_finishes_with_checked_outputs(
    rig: AgentRig, tmp_path: Path
) -> None:
    _notes(rig, tmp_path)
    headers = {"Authorization": "Bearer ${API_TOKEN}"}
    rig.model.script(
        reply(text("Looking around."), tool_use("list_files")),
        reply(
            tool_use("read_file", {"path": "data/facts.txt"}),
            tool_use("http_request", {"url": rig.url("/items"), "headers": headers}),
        ),
        reply(tool_use("write_file", {"path": "summary.md", "content": "# Two facts"})),
        reply(tool_use("finish", {"outputs": {"summary": "two facts", "count": "2"}})),
        reply(tool_use("finish", {"outputs": {"summary": "two facts", "count": 2}})),
    )
    run_id = start_run(rig.api, "notes", {"topic": "facts"})
    run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"summary": "two facts", "count": 2}
    assert [a["name"] for a in run["artifacts"]] == ["summary.md"]
    calls = run["tool_calls"]
    assert [(c["seq"], c["tool"], c["status"]) for c in calls] == [
        (1, "list_files", "ok"),
        (2, "read_file", "ok"),
        (3, "http_request", "ok"),
        (4, "write_file", "ok"),
        (5, "finish", "error"),
        (6, "finish", "ok"),
    ]
    assert "data/facts.txt" in calls[0]["result"]
    assert "outputs.count" in calls[4]["error"]
    # The model saw exactly the allowed tools, and each result came back to it.
    assert rig.model.tool_names(0) == [
        "read_file",
        "list_files",
        "write_file",
        "http_request",
        "finish",
    ]
    assert rig.model.requests[0]["model"] == "claude-sonnet-4-5"
    assert "Summarise the facts" in rig.model.requests[0]["system"]
    read, http = rig.model.tool_results(2)
    assert "fact one" in read["content"]
    assert json.loads(http["content"])["status"] == 200
    assert "outputs.count" in rig.model.tool_results(4)[0]["content"]
    assert rig.model.tool_results(4)[0]["is_error"] is True
    # The real SDK sent the configured key.
    assert set(rig.model.auth_headers) <= {MODEL_KEY, f"Bearer {MODEL_KEY}"}
    assert run["model_usage"]["iterations"] == 5
    assert run["model_usage"]["input_tokens"] == 500
    assert run["model_usage"]["output_tokens"] == 100
    assert run["model_usage"]["cost_usd"] == pytest.approx((500 * 3 + 100 * 15) / 1e6)
    lines = log_lines(rig.api, run_id)
    assert any(line.startswith("tool list_files") for line in lines)
    assert "agent: Looking around." in lines
    transcript = rig.api.get(f"/api/v1/runs/{run_id}/transcript").json()
    assert [m["role"] for m in transcript["messages"]][:3] == ["user", "assistant", "user"]


def test_secret_values_are_filled_in_for_the_request_and_redacted_everywhere_after(
    rig: AgentRig, tmp_path: Path
) -> None:
    _notes(rig, tmp_path)
    rig.model.script(
        reply(
            tool_use(
                "http_request",
                {"url": rig.url("/me"), "headers": {"Authorization": "Bearer ${API_TOKEN}"}},
            )
        ),
        reply(tool_use("finish", {"outputs": {"summary": f"the token is {TOKEN}"}})),
    )
    run_id = start_run(rig.api, "notes", {"topic": "me"})
    run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded"
    (seen,) = rig.echo["requests"]
    assert seen["headers"]["authorization"] == f"Bearer {TOKEN}"
    http = run["tool_calls"][0]
    assert http["arguments"]["headers"]["Authorization"] == "Bearer ${API_TOKEN}"
    assert TOKEN not in json.dumps(run)
    assert "***" in http["result"]
    assert run["outputs"] == {"summary": "the token is ***"}
    assert TOKEN not in json.dumps(rig.model.requests)
    transcript = rig.api.get(f"/api/v1/runs/{run_id}/transcript").text
    assert TOKEN not in transcript
    assert TOKEN not in rig.api.get(f"/api/v1/runs/{run_id}/logs").text


def test_http_requests_stay_inside_allow_domains_even_through_redirects(
    rig: AgentRig, tmp_path: Path
) -> None:
    _notes(rig, tmp_path)
    elsewhere = f"http://127.0.0.1:{rig.echo['port']}/secret"
    rig.model.script(
        reply(
            tool_use("http_request", {"url": f"http://evil.test:{rig.echo['port']}/"}),
            tool_use("http_request", {"url": rig.url(f"/redirect?to={elsewhere}")}),
            tool_use("http_request", {"url": "file:///etc/passwd"}),
        ),
        reply(tool_use("finish", {"outputs": {"summary": "done"}})),
    )
    run = wait_status(rig.api, start_run(rig.api, "notes", {"topic": "x"}))

    assert run["status"] == "succeeded"
    errors = [c["error"] for c in run["tool_calls"][:3]]
    assert "evil.test is not in this tool's allow_domains" in errors[0]
    assert "127.0.0.1 is not in this tool's allow_domains" in errors[1]
    assert "only http and https" in errors[2]
    assert [r["path"] for r in rig.echo["requests"]] == [f"/redirect?to={elsewhere}"]


def test_private_loopback_and_link_local_addresses_are_refused_after_resolution(
    tmp_path: Path, database_url: str
) -> None:
    resolve = "metadata.test=169.254.169.254,intranet.test=10.1.2.3,sneaky.test=127.0.0.1"
    with agent_rig(
        tmp_path / "data",
        database_url,
        agent_http_allow_private=False,
        agent_http_resolve=resolve,
    ) as rig:
        rig.deploy(
            agent_worker(
                tmp_path / "probe",
                """\
name: probe
tools:
  - builtin: http_request
    allow_domains: [localhost, 127.0.0.1, metadata.test, intranet.test, sneaky.test, "::1"]
""",
            )
        )
        port = rig.echo["port"]
        urls = [
            f"http://localhost:{port}/",
            f"http://127.0.0.1:{port}/",
            "http://metadata.test/latest/meta-data",
            "http://intranet.test/",
            f"http://sneaky.test:{port}/",
            f"http://[::1]:{port}/",
        ]
        rig.model.script(
            reply(*[tool_use("http_request", {"url": u}) for u in urls]),
            reply(tool_use("finish", {"outputs": {}})),
        )
        run = wait_status(rig.api, start_run(rig.api, "probe"))

    assert run["status"] == "succeeded", run
    errors = [c["error"] for c in run["tool_calls"][:6]]
    assert all(e and e.startswith("refused:") for e in errors), errors
    assert "loopback" in errors[0]
    assert "loopback" in errors[1]
    assert "169.254.169.254, a link-local address" in errors[2]
    assert "10.1.2.3, a private address" in errors[3]
    assert "127.0.0.1, a loopback address" in errors[4]
    assert "loopback" in errors[5]
    assert rig.echo["requests"] == []


def test_a_failed_model_call_is_retried_from_the_stored_transcript_without_redoing_calls(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(
        agent_worker(
            tmp_path / "steady",
            """\
name: steady
retries: {count: 1, backoff_seconds: 0}
limits: {timeout_seconds: 60}
tools: [{builtin: write_file}, {builtin: read_file}]
""",
        )
    )
    rig.model.script(
        reply(tool_use("write_file", {"path": "draft.md", "content": "kept across attempts"})),
        failure(500, "overloaded"),
        reply(tool_use("read_file", {"path": "output/draft.md"})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    run = wait_status(rig.api, start_run(rig.api, "steady"))

    assert run["status"] == "succeeded", run
    assert run["attempt"] == 2
    assert [(c["tool"], c["attempt"]) for c in run["tool_calls"]] == [
        ("write_file", 1),
        ("read_file", 2),
        ("finish", 2),
    ]
    assert run["tool_calls"][1]["result"] == "kept across attempts"
    assert [a["name"] for a in run["artifacts"]] == ["draft.md"]
    assert len(rig.model.requests) == 4
