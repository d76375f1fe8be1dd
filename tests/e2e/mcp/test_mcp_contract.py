"""One contract over both MCP backends: the endpoint mounted in the server (`/mcp`, which calls
the services in-process) and `floom mcp` over stdio (which calls the REST API). Every test runs
once per backend through the SDK's own client and asserts the same things, so the two cannot
drift: same tools, same arguments, same answers, same errors, same scope rules."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.support.harness import LiveServer, make_worker
from tests.support.mcp_clients import (
    FLOOM_TOOLS,
    call,
    call_error,
    call_raw,
    http_client,
    stdio_client,
    text_of,
    worker_files,
)

# The REST API under the stdio backend runs on both databases elsewhere; one is enough here
# (each stdio test spawns `floom mcp`).
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

Opener = Callable[..., AbstractAsyncContextManager[Client]]

ECHO_YML = """\
name: echo
description: Echoes a word.
inputs:
  word: {type: string, required: true}
outputs:
  echo: {type: string, required: true}
"""
ECHO_PY = """\
import json
word = json.load(open("inputs.json"))["word"]
print("echoing", word)
json.dump({"outputs": {"echo": word}}, open("result.json", "w"))
"""
NAP_YML = """\
name: nap
triggers:
  - schedule: {cron: "15 4 * * *", timezone: UTC}
"""
NAP_SH = "sleep 30\n"
# Each backend takes a folder its own way: the endpoint only as files sent in the call (the
# server never reads a caller's path), `floom mcp` also as a path on the caller's machine.
DEPLOY_ONLY_ON_STDIO = {"folder"}


@pytest.fixture(params=["endpoint", "stdio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def opener(backend: str, server: LiveServer) -> Opener:
    """Opens an MCP session to `server` with a key (the admin key when None)."""

    def open_(key: str | None = None) -> AbstractAsyncContextManager[Client]:
        return (http_client if backend == "endpoint" else stdio_client)(server, key)

    return open_


async def deploy(mcp: Client, folder: Path) -> dict[str, Any]:
    return await call(mcp, "deploy_worker", files=worker_files(folder))


def run_session(body: Callable[[], Any]) -> None:
    async def session() -> None:
        await body()

    anyio.run(session)


def test_both_backends_list_every_floom_tool_with_the_same_arguments(
    server: LiveServer,
) -> None:
    async def tools(opened: AbstractAsyncContextManager[Client]) -> dict[str, set[str]]:
        async with opened as mcp:
            listed = (await mcp.list_tools()).tools
        return {t.name: set(t.input_schema.get("properties", {})) for t in listed}

    async def session() -> None:
        endpoint = await tools(http_client(server))
        stdio = await tools(stdio_client(server))
        assert set(endpoint) >= FLOOM_TOOLS
        assert set(endpoint) == set(stdio)
        for name, arguments in endpoint.items():
            extra = DEPLOY_ONLY_ON_STDIO if name in ("deploy_worker", "validate_worker") else set()
            assert stdio[name] - extra == arguments, name

    anyio.run(session)


def test_a_deployed_worker_runs_and_its_run_logs_and_versions_read_back(
    opener: Opener, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "echo", ECHO_YML, {"run.py": ECHO_PY})

    async def body() -> None:
        async with opener() as mcp:
            deployed = await deploy(mcp, folder)
            assert deployed["worker"]["name"] == "echo"
            assert deployed["created"] is True
            again = await deploy(mcp, folder)
            assert again["created"] is False
            assert again["version"]["id"] == deployed["version"]["id"]

            started = await call(
                mcp, "run_worker", worker="echo", inputs={"word": "floom"}, wait_seconds=30
            )
            assert started["finished"] is True
            run = started["run"]
            assert run["status"] == "succeeded"
            assert run["outputs"] == {"echo": "floom"}

            got = await call(mcp, "get_run", run_id=run["id"])
            assert (got["id"], got["status"], got["outputs"]) == (
                run["id"],
                "succeeded",
                {"echo": "floom"},
            )
            listed = await call(mcp, "list_runs", worker="echo")
            assert [r["id"] for r in listed["items"]] == [run["id"]]
            logs = await call(mcp, "get_run_logs", run_id=run["id"])
            assert any("echoing floom" in line["line"] for line in logs["items"])
            versions = await call(mcp, "list_versions", worker="echo")
            assert [v["id"] for v in versions["items"]] == [deployed["version"]["id"]]
            workers = await call(mcp, "list_workers")
            assert [w["name"] for w in workers["items"]] == ["echo"]

    run_session(body)


def test_bad_calls_are_tool_errors_with_a_code_and_a_hint(opener: Opener, tmp_path: Path) -> None:
    folder = make_worker(tmp_path / "echo", ECHO_YML, {"run.py": ECHO_PY})

    async def body() -> None:
        async with opener() as mcp:
            error = await call_error(mcp, "run_worker", worker="nope")
            assert error["code"] == "not_found"
            assert "nope" in error["message"]
            assert error["hint"]
            error = await call_error(mcp, "get_run", run_id="run_nope")
            assert error["code"] == "not_found"
            await deploy(mcp, folder)
            error = await call_error(mcp, "run_worker", worker="echo", inputs={})
            assert error["code"] == "input_invalid"
            assert "word" in error["message"]
            error = await call_error(mcp, "deploy_worker", files={"worker.yml": "name: [\n"})
            assert error["code"] == "manifest_invalid"
            error = await call_error(mcp, "delete_worker", worker="echo")
            assert error["code"] == "invalid_request"
            assert "confirm=true" in error["message"]

    run_session(body)


def test_a_read_key_sees_only_what_it_may_use_and_is_refused_the_rest(
    opener: Opener, server: LiveServer, tmp_path: Path
) -> None:
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    folder = make_worker(tmp_path / "echo", ECHO_YML, {"run.py": ECHO_PY})

    async def body() -> None:
        async with opener() as mcp:
            await deploy(mcp, folder)
        async with opener(read_key) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"list_workers", "get_worker", "get_run", "list_runs"} <= names
            assert not names & {"deploy_worker", "run_worker", "set_secret", "cancel_run"}
            assert [w["name"] for w in (await call(mcp, "list_workers"))["items"]] == ["echo"]
            error = await call_error(mcp, "run_worker", worker="echo", inputs={"word": "x"})
            assert error["code"] == "forbidden"
            assert "'run'" in error["message"]

    run_session(body)


def test_secrets_are_set_listed_by_name_and_deleted_but_never_shown(opener: Opener) -> None:
    value = "s3cr3t-contract-value"

    async def body() -> None:
        async with opener() as mcp:
            results = [await call_raw(mcp, "set_secret", name="CONTRACT_TOKEN", value=value)]
            results.append(await call_raw(mcp, "list_secrets"))
            listed = results[-1].structured_content or {}
            assert [s["name"] for s in listed["items"]] == ["CONTRACT_TOKEN"]
            results.append(await call_raw(mcp, "delete_secret", name="CONTRACT_TOKEN"))
            assert (await call(mcp, "list_secrets"))["items"] == []
            assert all(value not in text_of(r) and value not in repr(r) for r in results)
            error = await call_error(mcp, "delete_secret", name="CONTRACT_TOKEN")
            assert error["code"] == "not_found"
            refused = await call_error(mcp, "set_secret", name="LD_PRELOAD", value="/work/x.so")
            assert refused["code"] == "secret_name_refused"
            assert "dynamic loader" in refused["message"]

    run_session(body)


def test_a_schedule_pauses_and_resumes_and_a_running_run_is_cancelled(
    opener: Opener, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "nap", NAP_YML, {"run.sh": NAP_SH})

    async def body() -> None:
        async with opener() as mcp:
            await deploy(mcp, folder)
            (trigger,) = (await call(mcp, "list_triggers", worker="nap"))["items"]
            assert trigger["kind"] == "schedule"
            assert len(trigger["next_fires"]) == 3
            paused = await call(mcp, "pause_worker", worker="nap", trigger=trigger["id"])
            assert [t["paused"] for t in paused["items"]] == [True]
            resumed = await call(mcp, "resume_worker", worker="nap", trigger=trigger["id"])
            assert [t["paused"] for t in resumed["items"]] == [False]

            started = await call(mcp, "run_worker", worker="nap")
            assert started["finished"] is False
            cancelled = await call(mcp, "cancel_run", run_id=started["run"]["id"], wait_seconds=20)
            assert cancelled["status"] == "cancelled"
            assert cancelled["finished"] is True

    run_session(body)
