"""An agent's whole session over MCP, on `/mcp` (HTTP) and through `floom mcp` (stdio), with
the SDK's own client and only what the tools and their answers say: deploy, run, read logs
and artifacts, a run that fails and the hint followed to its logs, replay, roll back,
approve, hand off. Every tool an answer names must be one that tools/list shows."""

from __future__ import annotations

import ast
import json
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.support.harness import LiveServer, live_server, make_worker
from tests.support.mcp_clients import call_raw, http_client, stdio_client, text_of, worker_files

# A tool call as answers write it: get_run_logs(run_id='run_...', tail=50).
HINTED_CALL = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\(([^()]*)\)")
WAIT = 30

GREET_YML = """\
name: {name}
inputs:
  name: {{type: string, required: true}}
outputs:
  greeting: {{type: string, required: true}}
expose: [mcp]
"""
GREET_PY = """\
import json, os
name = json.load(open("inputs.json"))["name"]
print("greeting", name, flush=True)
with open(os.path.join(os.environ["FLOOM_OUTPUT_DIR"], "card.txt"), "w") as card:
    card.write(f"a card for {name}\\n")
json.dump({"outputs": {"greeting": f"Hello, {name}!"}}, open("result.json", "w"))
"""
BROKEN_PY = """\
import sys
print("calling the greeting service", flush=True)
sys.exit("boom: the greeting service is down")
"""
GATED_YML = """\
name: {name}
outputs:
  title: {{type: string, required: true}}
approvals: {{required: true}}
"""
GATED_PY = """\
import json, os
if os.environ["FLOOM_PHASE"] == "propose":
    json.dump({"outputs": {"title": "Draft title"}}, open("result.json", "w"))
else:
    decision = json.load(open("decision.json"))
    print("publishing", decision["outputs"]["title"], flush=True)
"""


class Placeholder(str):
    """An argument a hint leaves for the agent to fill in (VERSION, RUN_ID, ...)."""


@dataclass(frozen=True)
class HintedCall:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    data: dict[str, Any]
    text: str
    hint: str

    def calls(self) -> list[HintedCall]:
        """Every tool call this answer names, in its text and its hint."""
        return [_parse_call(m) for m in HINTED_CALL.finditer(f"{self.text}\n{self.hint}")]

    def call_of(self, tool: str) -> HintedCall:
        named = [c for c in self.calls() if c.tool == tool]
        assert named, f"the answer names no {tool}: {self.text}\nhint: {self.hint}"
        return named[0]


def _parse_call(match: re.Match[str]) -> HintedCall:
    call = ast.parse(f"_({match.group(2)})", mode="eval").body
    assert isinstance(call, ast.Call), match.group(0)
    assert not call.args, match.group(0)  # keywords only
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        assert keyword.arg is not None, match.group(0)
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            arguments[keyword.arg] = Placeholder(ast.unparse(keyword.value))
    return HintedCall(match.group(1), arguments)


@dataclass
class Agent:
    """A model's view of floom: the tools listed, and every answer it was given."""

    mcp: Client
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)

    async def list_tools(self) -> None:
        listed = (await self.mcp.list_tools()).tools
        self.tools = {t.name: t.input_schema for t in listed}

    async def call(self, tool: str, **arguments: Any) -> Answer:
        answer, failed = await self._ask(tool, arguments)
        assert not failed, f"{tool} failed: {answer.text}"
        return answer

    async def fail(self, tool: str, **arguments: Any) -> Answer:
        answer, failed = await self._ask(tool, arguments)
        assert failed, f"{tool} should have failed: {answer.text}"
        return answer

    async def follow(self, hinted: HintedCall, **more: Any) -> Answer:
        """Call what a hint names as it names it: `more` fills in the placeholders it left or
        adds arguments it did not give (the tool's schema must offer them)."""
        arguments = dict(hinted.arguments)
        for name, value in more.items():
            assert name not in arguments or isinstance(arguments[name], Placeholder), hinted
            arguments[name] = value
        assert not [v for v in arguments.values() if isinstance(v, Placeholder)], hinted
        return await self.call(hinted.tool, **arguments)

    async def _ask(self, tool: str, arguments: dict[str, Any]) -> tuple[Answer, bool]:
        if tool not in self.tools:
            await self.list_tools()  # deploys change the list
        assert tool in self.tools, f"{tool} is not in tools/list"
        assert set(arguments) <= set(self.tools[tool].get("properties") or {}), (tool, arguments)
        result = await call_raw(self.mcp, tool, **arguments)
        # The data once, as structured content; the one text block summarises, not a copy.
        assert len(result.content) == 1, (tool, result.content)
        assert not text_of(result).lstrip().startswith(("{", "[")), (tool, text_of(result))
        data = result.structured_content or {}
        error = data.get("error") if result.is_error else None
        hint = str((error or {}).get("hint") or "")
        answer = Answer(data=data, text=text_of(result), hint=hint)
        self.answers.append(answer)
        return answer, bool(result.is_error)

    def check_every_hint(self) -> None:
        """Each tool any answer named exists, and no answer sends the agent to a shell."""
        named = {c.tool for a in self.answers for c in a.calls()}
        assert named <= set(self.tools), named - set(self.tools)
        for answer in self.answers:
            # Structured content too: stored run errors and log notices come told for MCP.
            assert "`floom " not in answer.text + answer.hint + json.dumps(answer.data), answer
            assert "/api/v1" not in answer.hint, answer


@dataclass(frozen=True)
class Transport:
    name: str
    connect: Callable[[LiveServer, str], AbstractAsyncContextManager[Client]]
    # How the deploy tool takes a folder where this transport runs: a path or its files.
    deploy_argument: Callable[[Path], dict[str, Any]]


TRANSPORTS = [
    Transport("http", http_client, lambda folder: {"files": worker_files(folder)}),
    Transport("stdio", stdio_client, lambda folder: {"folder": str(folder)}),
]


@dataclass(frozen=True)
class Session:
    server: LiveServer
    root: Path

    def agent_key(self, api: httpx.Client, label: str, role: str, scopes: list[str]) -> str:
        created = api.post("/api/v1/roles", json={"name": role})
        assert created.status_code == 201, created.text
        body = {"label": label, "roles": [role], "scopes": scopes}
        answer = api.post("/api/v1/agents", json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One floom server for every transport's session (each uses names of its own)."""
    root = tmp_path_factory.mktemp("agent-session")
    with live_server(root / "data", f"sqlite:///{root / 'floom.db'}") as server:
        yield Session(server, root)


@pytest.mark.parametrize("transport", TRANSPORTS, ids=lambda t: t.name)
def test_an_agent_deploys_runs_debugs_replays_rolls_back_approves_and_hands_off(
    session: Session, transport: Transport
) -> None:
    t = transport.name
    greet, gated = f"greet-{t}", f"publish-{t}"
    folders = session.root / t
    good = make_worker(folders / "good", GREET_YML.format(name=greet), {"run.py": GREET_PY})
    broken = folders / "broken"
    shutil.copytree(good, broken)
    (broken / "run.py").write_text(BROKEN_PY)
    publish = make_worker(folders / "gated", GATED_YML.format(name=gated), {"run.py": GATED_PY})
    with session.server.client() as api:
        builder_key = session.agent_key(api, f"builder-{t}", f"builder-{t}", ["deploy"])
        reviewer_key = session.agent_key(api, f"reviewer-{t}", f"reviewer-{t}", ["run"])

    async def agent_session() -> None:
        async with (
            transport.connect(session.server, builder_key) as builder_mcp,
            # The other agent is on /mcp either way (test_mcp_handoffs mixes them too).
            http_client(session.server, reviewer_key) as reviewer_mcp,
        ):
            agent, reviewer = Agent(builder_mcp), Agent(reviewer_mcp)
            await agent.list_tools()
            deploy = transport.deploy_argument

            # Deploy a folder, run it and read its logs and its artifact.
            first = await agent.call("deploy_worker", **deploy(good))
            v1 = first.data["version"]["id"]
            ran = await agent.call(
                "run_worker", worker=greet, inputs={"name": "Ada"}, wait_seconds=WAIT
            )
            run = ran.data["run"]
            assert run["status"] == "succeeded"
            assert run["outputs"] == {"greeting": "Hello, Ada!"}
            logs = await agent.call("get_run_logs", run_id=run["id"])
            assert ("stdout", "greeting Ada") in [
                (e["stream"], e["line"]) for e in logs.data["items"]
            ]
            detail = await agent.call("get_run", run_id=run["id"])
            card = await agent.follow(detail.call_of("get_artifact"))
            assert card.data["text"] == "a card for Ada\n"

            # A new version breaks; the worker's own tool says where to look, and the
            # agent follows that hint to the log line saying why.
            second = await agent.call("deploy_worker", **deploy(broken))
            assert second.data["version"]["id"] != v1
            failed = await agent.fail(greet, name="Bob")
            assert failed.data["error"]["code"] == "run_failed"
            why = await agent.follow(failed.call_of("get_run_logs"))
            assert any("greeting service is down" in e["line"] for e in why.data["items"])
            failed_id = failed.call_of("get_run_logs").arguments["run_id"]
            listed = await agent.call("list_runs", worker=greet, status="failed")
            assert [r["id"] for r in listed.data["items"]] == [failed_id]

            # Replaying on the same version fails again; the answer names what comes next.
            replay = await agent.call("replay_run", run_id=failed_id, wait_seconds=WAIT)
            assert replay.data["run"]["status"] == "failed"
            assert replay.data["run"]["replay_of"] == failed_id

            # Rolling back to a version that does not exist says where the versions are;
            # the agent picks the one before the break there.
            wrong = await agent.fail("rollback_worker", worker=greet, version_id="v000000000000")
            versions = await agent.follow(wrong.call_of("list_versions"))
            (earlier,) = [v["id"] for v in versions.data["items"] if not v["active"]]
            assert earlier == v1
            rolled = await agent.call("rollback_worker", worker=greet, version_id=earlier)
            assert rolled.data["changed"] is True
            again = await agent.call("rollback_worker", worker=greet, version_id=earlier)
            assert again.data["changed"] is False  # already active: a quiet success
            # The failed replay named the replay to run after a fix; started, it names
            # how to follow it.
            started = await agent.follow(replay.call_of("replay_run"))
            fixed = await agent.follow(started.call_of("watch_run"))
            assert fixed.data["run"]["status"] == "succeeded"
            assert fixed.data["run"]["outputs"] == {"greeting": "Hello, Bob!"}
            lineage = (await agent.call("get_run", run_id=fixed.data["run"]["id"])).data
            assert lineage["lineage"]["replay_of"] == replay.data["run"]["id"]

            # A gated run waits for a person: its answer names the approval to decide, and
            # then how to follow the run to its end.
            await agent.call("deploy_worker", **deploy(publish))
            proposed = await agent.call("run_worker", worker=gated, wait_seconds=WAIT)
            assert proposed.data["run"]["status"] == "awaiting_approval"
            decided = await agent.follow(
                proposed.call_of("decide_approval"), edits={"title": "Final title"}
            )
            assert decided.data["status"] == "approved"
            applied = await agent.follow(proposed.call_of("watch_run"))
            assert applied.data["run"]["status"] == "succeeded"
            assert applied.data["run"]["outputs"] == {"title": "Final title"}
            assert any("publishing Final title" in e["line"] for e in applied.data["logs"])

            # Hand the review to another agent by role; it claims and completes the job.
            job = await agent.call(
                "handoff_create_job",
                summary=f"review {greet} after the rollback",
                role=f"reviewer-{t}",
                context={"worker": greet, "run_id": fixed.data["run"]["id"]},
            )
            await reviewer.list_tools()
            claimed = (await reviewer.call("handoff_claim_next_job")).data["job"]
            assert claimed["id"] == job.data["id"]
            assert claimed["context"]["worker"] == greet
            await reviewer.call(
                "handoff_complete_job", job_id=claimed["id"], summary="the rollback holds"
            )
            done = await agent.call("handoff_get_job", job_id=job.data["id"])
            assert done.data["status"] == "completed"

            agent.check_every_hint()
            reviewer.check_every_hint()
            followed = {c.tool for a in agent.answers for c in a.calls()}
            assert {"get_artifact", "get_run_logs", "list_versions", "replay_run"} <= followed
            assert {"decide_approval", "watch_run"} <= followed

    anyio.run(agent_session)
