"""Approvals inside agent runs: gated tool calls pause the run durably (across a restart),
rejections reach the model, and the run-level gate proposes, then applies or stops."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.anthropic_api import messages_standin, reply, tool_use
from tests.standins.composio import composio_standin
from tests.standins.echo import echo_service
from tests.support.harness import make_worker
from tests.support.rigs.agents import (
    MODEL_KEY,
    AgentRig,
    agent_rig,
    agent_worker,
    log_lines,
    start_run,
    wait_status,
)

POSTER_YML = """\
name: poster
tools:
  - builtin: run_command
  - builtin: write_file
  - builtin: read_file
  - builtin: http_request
    name: post_update
    allow_domains: [api.example.test]
    methods: [POST]
    approval: always
"""


@pytest.fixture
def rig(tmp_path: Path, database_url: str) -> Iterator[AgentRig]:
    with agent_rig(tmp_path / "data", database_url) as r:
        yield r


def test_a_gated_call_pauses_the_run_durably_and_it_resumes_on_a_new_server(
    tmp_path: Path, database_url: str
) -> None:
    with messages_standin(MODEL_KEY) as model, echo_service() as echo:
        with agent_rig(
            tmp_path / "a", database_url, model=model, echo=echo, executor_slots=1
        ) as rig:
            rig.deploy(agent_worker(tmp_path / "poster", POSTER_YML))
            rig.deploy(
                make_worker(
                    tmp_path / "quick", "name: quick\n", {"run.py": "print('quick', flush=True)\n"}
                )
            )
            post = {"method": "POST", "url": rig.url("/updates"), "json": {"text": "draft"}}
            model.script(
                reply(
                    tool_use("run_command", {"command": "echo kept > note.txt"}),
                    tool_use("write_file", {"path": "draft.md", "content": "the draft"}),
                    tool_use("post_update", post),
                )
            )
            run_id = start_run(rig.api, "poster")
            paused = wait_status(rig.api, run_id, {"awaiting_approval"})

            (approval,) = paused["approvals"]
            assert (approval["kind"], approval["tool"]) == ("tool_call", "post_update")
            assert approval["proposed"] == post
            gated = paused["tool_calls"][2]
            assert (gated["status"], gated["approval_id"]) == ("awaiting_approval", approval["id"])
            assert [a["name"] for a in paused["artifacts"]] == ["draft.md"]
            assert echo["requests"] == []
            # The paused run holds no slot: a script run gets the only one meanwhile.
            quick = wait_status(rig.api, start_run(rig.api, "quick"))
            assert quick["status"] == "succeeded"

        with agent_rig(tmp_path / "b", database_url, model=model, echo=echo) as rig:
            model.script(
                reply(
                    tool_use("read_file", {"path": "note.txt"}),
                    tool_use("read_file", {"path": "output/draft.md"}),
                ),
                reply(tool_use("finish", {"outputs": {}})),
            )
            decided = rig.api.post(
                f"/api/v1/approvals/{approval['id']}/approve",
                json={"edited": {"json": {"text": "final"}}},
            )
            assert decided.status_code == 200, decided.text
            run = wait_status(rig.api, run_id)
            lines = log_lines(rig.api, run_id)

    assert run["status"] == "succeeded", run
    (sent,) = echo["requests"]
    assert (sent["method"], json.loads(sent["body"])) == ("POST", {"text": "final"})
    done = run["tool_calls"][2]
    assert done["status"] == "ok"
    assert done["arguments"]["json"] == {"text": "final"}
    assert json.loads(model.tool_results(1)[2]["content"])["status"] == 200
    kept, draft = model.tool_results(2)
    assert kept["content"].strip() == "kept"
    assert draft["content"] == "the draft"
    assert [a["name"] for a in run["artifacts"]] == ["draft.md"]
    assert any("resuming" in line for line in lines)


def test_a_rejected_call_reaches_the_model_as_a_refusal_with_the_comment(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(agent_worker(tmp_path / "poster", POSTER_YML))
    rig.model.script(
        reply(tool_use("post_update", {"method": "POST", "url": rig.url("/u"), "json": {}})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    run_id = start_run(rig.api, "poster")
    approval_id = wait_status(rig.api, run_id, {"awaiting_approval"})["approvals"][0]["id"]

    rig.api.post(f"/api/v1/approvals/{approval_id}/reject", json={"comment": "too noisy"})
    run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded"
    (refusal,) = rig.model.tool_results(1)
    assert refusal["is_error"] is True
    assert "too noisy" in refusal["content"]
    assert run["tool_calls"][0]["status"] == "rejected"
    assert rig.echo["requests"] == []


GATED_YML = """\
name: announcer
outputs:
  title: {type: string, required: true}
apply_secrets: [POST_TOKEN]
approvals: {required: true}
tools:
  - builtin: http_request
    allow_domains: [api.example.test]
"""


def test_an_agent_run_level_gate_applies_the_edited_outputs_with_apply_only_secrets(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(agent_worker(tmp_path / "announcer", GATED_YML))
    rig.api.put("/api/v1/secrets/POST_TOKEN", json={"value": "post-token-77"})
    with_token = {
        "method": "POST",
        "url": rig.url("/post"),
        "headers": {"X-Token": "${POST_TOKEN}"},
    }
    rig.model.script(
        reply(tool_use("http_request", with_token)),
        reply(tool_use("finish", {"outputs": {"title": "proposed"}})),
    )
    run_id = start_run(rig.api, "announcer")
    paused = wait_status(rig.api, run_id, {"awaiting_approval"})

    assert "no secret POST_TOKEN" in paused["tool_calls"][0]["error"]
    (approval,) = paused["approvals"]
    assert approval["kind"] == "run"
    assert approval["proposed"] == {"title": "proposed"}
    assert paused["outputs"] == {"title": "proposed"}
    rig.model.script(
        reply(tool_use("http_request", with_token)),
        reply(tool_use("finish", {"outputs": {"title": "ignored"}})),
    )
    rig.api.post(
        f"/api/v1/approvals/{approval['id']}/approve",
        json={"edited": {"title": "edited"}, "comment": "shorter"},
    )
    run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"title": "edited"}
    decision = rig.model.tool_results(2)[0]["content"]
    assert '"outputs": {"title": "edited"}' in decision
    assert "apply phase" in decision
    assert "shorter" in decision
    (posted,) = rig.echo["requests"]
    assert posted["headers"]["x-token"] == "post-token-77"
    assert "POST_TOKEN" in json.dumps(rig.model.requests[2]["tools"])
    assert "post-token-77" not in json.dumps(run)


def test_an_agent_run_level_rejection_ends_the_run_without_asking_the_model_again(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(agent_worker(tmp_path / "announcer", GATED_YML))
    rig.model.script(reply(tool_use("finish", {"outputs": {"title": "proposed"}})))
    run_id = start_run(rig.api, "announcer")
    approval_id = wait_status(rig.api, run_id, {"awaiting_approval"})["approvals"][0]["id"]

    rig.api.post(f"/api/v1/approvals/{approval_id}/reject", json={"comment": "wrong tone"})
    run = wait_status(rig.api, run_id)

    assert run["status"] == "rejected"
    assert "wrong tone" in run["error"]["message"]
    assert len(rig.model.requests) == 1


def test_request_approval_asks_a_person_and_returns_the_decision_with_its_comment(
    rig: AgentRig, tmp_path: Path
) -> None:
    rig.deploy(
        agent_worker(tmp_path / "asker", "name: asker\ntools: [{builtin: request_approval}]\n")
    )
    rig.model.script(reply(tool_use("request_approval", {"question": "Deploy on Friday?"})))
    run_id = start_run(rig.api, "asker")
    approval = wait_status(rig.api, run_id, {"awaiting_approval"})["approvals"][0]
    assert approval["proposed"] == {"question": "Deploy on Friday?"}

    rig.model.script(reply(tool_use("finish", {"outputs": {}})))
    rig.api.post(f"/api/v1/approvals/{approval['id']}/approve", json={"comment": "yes, go"})
    run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded"
    answer = json.loads(rig.model.tool_results(1)[0]["content"])
    assert answer == {"decision": "approved", "comment": "yes, go", "edited": None}


def test_composio_tools_are_filtered_by_allowed_tools_and_can_require_approval(
    tmp_path: Path, database_url: str
) -> None:
    composio_key = "cmp-key-5150"
    with (
        composio_standin(composio_key) as composio,
        agent_rig(
            tmp_path / "data",
            database_url,
            composio_api_key=composio_key,
            composio_base_url=composio["url"],
        ) as rig,
    ):
        rig.deploy(
            agent_worker(
                tmp_path / "mailer",
                """\
name: mailer
tools:
  - composio: {app: gmail, allowed_tools: [GMAIL_SEND_EMAIL], approval: always}
""",
            )
        )
        email = {"recipient_email": "ada@example.com", "body": "Hi"}
        rig.model.script(
            reply(
                tool_use("GMAIL_DELETE_MESSAGE", {"id": "1"}), tool_use("GMAIL_SEND_EMAIL", email)
            ),
        )
        run_id = start_run(rig.api, "mailer")
        approval_id = wait_status(rig.api, run_id, {"awaiting_approval"})["approvals"][0]["id"]
        assert composio["executed"] == []
        rig.model.script(reply(tool_use("finish", {"outputs": {}})))
        rig.api.post(f"/api/v1/approvals/{approval_id}/approve", json={})
        run = wait_status(rig.api, run_id)

    assert run["status"] == "succeeded", run
    assert rig.model.tool_names(0) == ["GMAIL_SEND_EMAIL", "finish"]
    assert [c["status"] for c in run["tool_calls"]] == ["refused", "ok", "ok"]
    assert composio["executed"] == [
        ("GMAIL_SEND_EMAIL", {"arguments": email, "user_id": "default"})
    ]
    assert set(composio["keys"]) == {composio_key}
    assert composio_key not in json.dumps(run)


RUNNER_YML = """\
name: runner
secrets: [RUNNER_TOKEN]
tools:
  - builtin: run_command
    approval: always
"""


def test_editing_a_gated_calls_arguments_needs_the_deploy_scope_not_just_run(
    rig: AgentRig, tmp_path: Path
) -> None:
    # Edits choose what the tool does: with a run key alone they would run any command
    # (with the worker's secrets) that no deployer wrote and no model proposed.
    rig.api.put("/api/v1/secrets/RUNNER_TOKEN", json={"value": "runner-secret-77"})
    rig.deploy(agent_worker(tmp_path / "runner", RUNNER_YML))
    rig.model.script(
        reply(tool_use("run_command", {"command": "echo proposed"})),
        reply(tool_use("finish", {"outputs": {}})),
    )
    run_id = start_run(rig.api, "runner")
    approval_id = wait_status(rig.api, run_id, {"awaiting_approval"})["approvals"][0]["id"]
    runner = rig.api.post("/api/v1/keys", json={"scopes": ["run"]}).json()["key"]

    with rig.server.client(runner) as client:
        edited = client.post(
            f"/api/v1/approvals/{approval_id}/approve",
            json={"edited": {"command": "echo $RUNNER_TOKEN | base64 > $FLOOM_OUTPUT_DIR/t"}},
        )
        assert edited.status_code == 403, edited.text
        error = edited.json()["error"]
        assert error["code"] == "forbidden"
        assert "deploy" in error["message"]
        assert rig.api.get(f"/api/v1/approvals/{approval_id}").json()["status"] == "pending"
        # As proposed, the run key may approve it.
        plain = client.post(f"/api/v1/approvals/{approval_id}/approve", json={})
        assert plain.status_code == 200, plain.text

    run = wait_status(rig.api, run_id)
    assert run["status"] == "succeeded", run
    assert run["tool_calls"][0]["arguments"] == {"command": "echo proposed"}
    assert run["artifacts"] == []
