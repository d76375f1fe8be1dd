"""Agent tools beyond HTTP and files: an MCP server over Streamable HTTP, other workers as
child runs, per-worker memory, commands in the sandbox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.anthropic_api import reply, tool_use
from tests.standins.mcp_tracker import tracker_server
from tests.support.harness import make_worker
from tests.support.rigs.agents import AgentRig, agent_rig, agent_worker, start_run, wait_status


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url, executor_slots=1) as r:
        yield r


def test_an_mcp_servers_allowed_tools_are_offered_and_called_with_its_secret(
    rig: AgentRig, tmp_path: Path
) -> None:
    token = "trk-token-31337"
    with tracker_server(token) as tracker:
        rig.deploy(
            agent_worker(
                tmp_path / "triage",
                f"""\
name: triage
tools:
  - mcp:
      name: tracker
      url: {tracker["url"]}
      auth_secret: TRACKER_TOKEN
      allowed_tools: [list_issues, create_issue]
""",
            )
        )
        rig.api.put("/api/v1/secrets/TRACKER_TOKEN", json={"value": token})
        rig.model.script(
            reply(
                tool_use("tracker__list_issues", {"state_filter": "open"}),
                tool_use("tracker__delete_issue", {"number": 1}),
            ),
            reply(tool_use("finish", {"outputs": {}})),
        )
        run = wait_status(rig.api, start_run(rig.api, "triage"))

    assert run["status"] == "succeeded", run
    assert rig.model.tool_names(0) == ["tracker__list_issues", "tracker__create_issue", "finish"]
    listed, deleted = run["tool_calls"][:2]
    assert listed["status"] == "ok"
    assert "Login fails" in listed["result"]
    assert deleted["status"] == "refused"
    assert tracker["calls"] == [("list_issues", {"state_filter": "open"})]
    assert set(tracker["auth"]) == {f"Bearer {token}"}
    assert token not in json.dumps(run)


def test_an_unreachable_mcp_server_fails_the_run_with_a_clear_error(
    rig: AgentRig, tmp_path: Path
) -> None:
    from tests.support.harness import free_port

    rig.deploy(
        agent_worker(
            tmp_path / "lost",
            f"""\
name: lost
tools:
  - mcp: {{name: gone, url: "http://127.0.0.1:{free_port()}/mcp", allowed_tools: ["*"]}}
""",
        )
    )
    run = wait_status(rig.api, start_run(rig.api, "lost"))

    assert run["status"] == "failed"
    assert run["error"]["code"] == "tool_source_unavailable"
    assert "gone" in run["error"]["message"]


def test_invoke_worker_runs_only_listed_workers_as_linked_child_runs(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(
        make_worker(
            tmp_path / "doubler",
            "name: doubler\ninputs: {n: integer}\n",
            {
                "run.py": "import json\nn = json.load(open('inputs.json'))['n']\n"
                "json.dump({'outputs': {'double': n * 2}}, open('result.json', 'w'))\n"
            },
        )
    )
    rig.deploy(make_worker(tmp_path / "other", "name: other\n", {"run.py": "pass\n"}))
    rig.deploy(
        agent_worker(
            tmp_path / "boss",
            """\
name: boss
calls: [doubler]
tools: [{builtin: invoke_worker}]
""",
        )
    )
    rig.model.script(
        reply(
            tool_use("invoke_worker", {"worker": "doubler", "inputs": {"n": 21}}),
            tool_use("invoke_worker", {"worker": "other"}),
        ),
        reply(tool_use("finish", {"outputs": {}})),
    )
    boss_id = start_run(rig.api, "boss")
    run = wait_status(rig.api, boss_id, timeout=60)

    assert run["status"] == "succeeded", run
    called, refused = run["tool_calls"][:2]
    child = json.loads(called["result"])
    assert (child["status"], child["outputs"]) == ("succeeded", {"double": 42})
    assert "not in this worker's calls" in refused["error"]
    child_run = rig.api.get(f"/api/v1/runs/{child['run_id']}").json()
    assert child_run["parent_run_id"] == boss_id
    assert child_run["trigger"] == "agent"
    assert rig.api.get("/api/v1/runs", params={"worker": "other"}).json()["items"] == []


def test_memory_written_by_one_run_is_recalled_by_the_next_with_the_writer(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(
        agent_worker(
            tmp_path / "keeper",
            """\
name: keeper
tools: [{builtin: remember}, {builtin: recall}]
""",
        )
    )
    rig.model.script(
        reply(tool_use("remember", {"key": "last_seen", "value": {"issue": 7}})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    first = wait_status(rig.api, start_run(rig.api, "keeper"))
    rig.model.script(
        reply(tool_use("recall", {"key": "last_seen"}), tool_use("recall")),
        reply(tool_use("finish", {"outputs": {}})),
    )
    second = wait_status(rig.api, start_run(rig.api, "keeper"))

    assert first["status"] == second["status"] == "succeeded"
    value, keys = (json.loads(c["result"]) for c in second["tool_calls"][:2])
    assert value == {
        "key": "last_seen",
        "found": True,
        "value": {"issue": 7},
        "written_by_run": first["id"],
    }
    assert keys == {"keys": ["last_seen"]}


def test_run_command_runs_in_the_sandbox_with_only_declared_secrets_redacted(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(
        agent_worker(
            tmp_path / "shell",
            """\
name: shell
secrets: [SHELL_TOKEN]
tools: [{builtin: run_command}]
""",
            **{"data.txt": "from the version\n"},
        )
    )
    rig.api.put("/api/v1/secrets/SHELL_TOKEN", json={"value": "shell-secret-99"})
    command = (
        "cat data.txt; echo token=$SHELL_TOKEN; echo key=${FLOOM_ANTHROPIC_API_KEY:-none}"
        "${ANTHROPIC_API_KEY:-}; echo out > $FLOOM_OUTPUT_DIR/made.txt; hostname"
    )
    rig.model.script(
        reply(tool_use("run_command", {"command": command})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    run = wait_status(rig.api, start_run(rig.api, "shell"))

    assert run["status"] == "succeeded", run
    result = run["tool_calls"][0]["result"]
    assert result.startswith("exit code 0")
    assert "from the version" in result
    assert "token=***" in result
    assert "key=none" in result
    assert "floom" in result.splitlines()[-1]
    assert [a["name"] for a in run["artifacts"]] == ["made.txt"]
    assert "shell-secret-99" not in rig.api.get(f"/api/v1/runs/{run['id']}/logs").text


def test_invoke_worker_is_refused_beyond_the_call_depth_limit(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url, agent_max_depth=0) as rig:
        rig.deploy(make_worker(tmp_path / "kid", "name: kid\n", {"run.py": "pass\n"}))
        rig.deploy(
            agent_worker(
                tmp_path / "boss", "name: boss\ncalls: [kid]\ntools: [{builtin: invoke_worker}]\n"
            )
        )
        rig.model.script(
            reply(tool_use("invoke_worker", {"worker": "kid"})),
            reply(tool_use("finish", {"outputs": {}})),
        )
        run = wait_status(rig.api, start_run(rig.api, "boss"))
        kids = rig.api.get("/api/v1/runs", params={"worker": "kid"}).json()["items"]

    assert run["status"] == "succeeded"
    assert "FLOOM_AGENT_MAX_DEPTH" in run["tool_calls"][0]["error"]
    assert kids == []
