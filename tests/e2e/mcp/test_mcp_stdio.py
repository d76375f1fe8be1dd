"""`floom mcp`, spawned as a coding agent would, through the SDK's own stdio client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from floom.client.rest import FloomClient
from floom.mcp.stdio import configured_key, identify
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.support.harness import EXAMPLES, LiveServer, free_port, make_worker
from tests.support.mcp_clients import (
    CALL_TIMEOUT,
    FLOOM_TOOLS,
    call,
    call_error,
    call_raw,
    stdio_client,
    stdio_params,
    text_of,
)

ECHO_YML = """\
name: echo
description: Echoes a word.
inputs:
  word: {type: string, required: true}
expose: [mcp]
"""
# These tests are about the stdio transport: the REST API below it runs on both databases in
# the other tests, so one database is enough here (each test spawns `floom mcp`).
ONE_DATABASE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

NIGHTLY_YML = """\
name: nightly
triggers:
  - schedule: {cron: "30 2 * * *", timezone: Asia/Tokyo}
"""
ECHO_PY = """\
import json
word = json.load(open("inputs.json"))["word"]
json.dump({"outputs": {"echo": word}}, open("result.json", "w"))
"""


def test_without_configuration_it_starts_lists_its_tools_and_each_call_explains_the_setup(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["FLOOM_DATA_DIR"] = str(tmp_path / "no-server-here")

    async def session() -> None:
        async with Client(stdio_params(env), read_timeout_seconds=CALL_TIMEOUT) as mcp:
            # What a client shows first: the instructions open with the setup to do.
            assert mcp.instructions is not None
            assert mcp.instructions.startswith("NOT CONFIGURED: ")
            assert "FLOOM_API_KEY" in mcp.instructions
            assert "--key-file" in mcp.instructions
            assert {t.name for t in (await mcp.list_tools()).tools} >= FLOOM_TOOLS
            for tool, args in [
                ("list_workers", {}),
                ("run_worker", {"worker": "hello"}),
                ("deploy_worker", {"folder": str(EXAMPLES / "hello")}),
            ]:
                error = await call_error(mcp, tool, **args)
                assert error["code"] == "not_configured", (tool, error)
                assert "FLOOM_API_KEY" in error["message"]
                assert "--key-file" in error["message"]
                assert "FLOOM_BASE_URL" in error["hint"]
                admin_key = tmp_path / "no-server-here" / "admin.key"
                assert f"--key-file {admin_key}" in error["hint"]
                # The setup is for the person at this machine's shell: its commands are told
                # as written, not as another surface's.
                assert "(the admin key a `floom serve` on this machine saved)" in error["hint"]
                assert "`floom keys create --scope deploy`. With Claude" in error["hint"]

    anyio.run(session)


@ONE_DATABASE
def test_the_admin_key_a_local_server_saved_is_used_only_when_its_file_is_named(
    server: LiveServer,
) -> None:
    env = server.cli_env(key="")
    del env["FLOOM_API_KEY"]
    admin_key = Path(env["FLOOM_DATA_DIR"]) / "admin.key"
    admin_key.parent.mkdir(parents=True, exist_ok=True)
    admin_key.write_text(server.admin_key + "\n")

    async def session() -> None:
        # The CLI would fall back to this file; the MCP server does not.
        async with Client(stdio_params(env), read_timeout_seconds=CALL_TIMEOUT) as mcp:
            assert mcp.instructions
            assert mcp.instructions.startswith("NOT CONFIGURED: ")
            error = await call_error(mcp, "list_workers")
            assert error["code"] == "not_configured"
        async with Client(
            stdio_params(env, "--key-file", str(admin_key)), read_timeout_seconds=CALL_TIMEOUT
        ) as mcp:
            assert mcp.instructions is not None
            assert (
                f"acts as the API key 'test admin' (scope admin) from the key file {admin_key}"
                in mcp.instructions
            )
            assert server.admin_key not in mcp.instructions
            assert (await call(mcp, "list_workers"))["items"] == []

    anyio.run(session)


def test_a_key_file_it_cannot_use_is_named_in_the_setup_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["FLOOM_API_KEY"] = "flm_set_in_the_environment"
    missing = tmp_path / "missing.key"

    async def session() -> None:
        # Named explicitly, an unusable file wins over FLOOM_API_KEY: no silent fallback.
        params = stdio_params(env, "--key-file", str(missing))
        async with Client(params, read_timeout_seconds=CALL_TIMEOUT) as mcp:
            assert mcp.instructions
            assert mcp.instructions.startswith("NOT CONFIGURED: ")
            assert f"the key file {missing} (--key-file) does not exist" in mcp.instructions
            error = await call_error(mcp, "list_workers")
            assert error["code"] == "not_configured"
            assert f"the key file {missing} (--key-file) does not exist" in error["message"]

    anyio.run(session)


def test_a_key_file_holds_one_key_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "empty.key").write_text("\n")
    (tmp_path / "two.key").write_text("flm_one\nflm_two\n")
    (tmp_path / "big.key").write_text("flm_" + "x" * 5000)
    (tmp_path / "good.key").write_text("  flm_good\n")
    for name, why in [
        ("empty.key", "is empty"),
        ("two.key", "does not hold a single API key"),
        ("big.key", "does not hold a single API key"),
    ]:
        key = configured_key(str(tmp_path / name))
        assert key.value is None
        assert key.problem is not None
        assert why in key.problem.message
        assert "flm_" not in key.problem.message
    directory = configured_key(str(tmp_path))
    assert directory.problem is not None
    assert "a directory" in directory.problem.message
    good = configured_key(str(tmp_path / "good.key"))
    assert (good.value, good.source, good.problem) == (
        "flm_good",
        f"the key file {tmp_path / 'good.key'}",
        None,
    )


@ONE_DATABASE
def test_it_serves_the_same_tools_as_the_endpoint_and_names_unknown_workers(
    server: LiveServer,
) -> None:
    async def session() -> None:
        async with stdio_client(server) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(listed) >= FLOOM_TOOLS
            # On the caller's machine a folder can be packed: deploy and validate offer it.
            for tool in ("deploy_worker", "validate_worker"):
                assert {"folder", "files"} <= set(listed[tool].input_schema["properties"])
            error = await call_error(mcp, "run_worker", worker="nope")
            assert error["code"] == "not_found"
            assert "nope" in error["message"]
            error = await call_error(mcp, "get_run_logs", run_id="run_nope")
            assert error["code"] == "not_found"
            error = await call_error(mcp, "deploy_worker", folder="/no/such/folder")
            assert error["code"] == "bundle_invalid"
            assert error["hint"]

    anyio.run(session)


@ONE_DATABASE
def test_the_scope_of_the_configured_key_limits_what_it_can_do(server: LiveServer) -> None:
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")

    async def session() -> None:
        async with stdio_client(server, read_key) as mcp:
            # The stdio server asks the server which key it holds, says so in its
            # instructions (never the value) and lists only read tools.
            assert mcp.instructions is not None
            assert "acts as the API key 'reader' (scope read) from FLOOM_API_KEY" in (
                mcp.instructions
            )
            assert read_key not in mcp.instructions
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"list_workers", "get_run"} <= names
            assert not names & {"deploy_worker", "run_worker", "set_secret"}
            assert (await call(mcp, "list_workers"))["items"] == []
            error = await call_error(mcp, "deploy_worker", folder=str(EXAMPLES / "hello"))
            assert error["code"] == "forbidden"
            assert "'deploy'" in error["message"]

        async with stdio_client(server) as mcp:
            # The server told this error for MCP already; the stdio server passes it on as
            # told, saying once that no tool creates an agent.
            error = await call_error(mcp, "handoff_claim_next_job")
            assert error["code"] == "forbidden"
            assert error["hint"].count("`floom agents create`") == 1
            assert error["hint"].count("no MCP tool does it") == 1

    anyio.run(session)


@ONE_DATABASE
def test_a_handshake_era_client_hears_that_the_tool_list_changed_after_a_deploy(
    server: LiveServer, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "echo", ECHO_YML, {"run.py": ECHO_PY})
    notices: list[str] = []

    async def on_message(message: Any) -> None:
        method = getattr(message, "method", None)
        if method:
            notices.append(method)

    async def session() -> None:
        async with Client(
            stdio_params(server.cli_env()),
            mode="legacy",
            message_handler=on_message,
            read_timeout_seconds=CALL_TIMEOUT,
        ) as mcp:
            assert mcp.server_capabilities.tools is not None
            assert mcp.server_capabilities.tools.list_changed is True
            assert "echo" not in {t.name for t in (await mcp.list_tools()).tools}
            await call(mcp, "deploy_worker", folder=str(folder))
            with anyio.fail_after(CALL_TIMEOUT):
                while "notifications/tools/list_changed" not in notices:
                    await anyio.sleep(0.05)
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert tools["echo"].input_schema["required"] == ["word"]
            echoed = await call(mcp, "echo", word="floom")
            assert echoed["outputs"] == {"echo": "floom"}

    anyio.run(session)


@ONE_DATABASE
def test_triggers_with_their_next_fires_and_pausing_go_through_the_rest_api(
    server: LiveServer, tmp_path: Path
) -> None:
    folder = make_worker(tmp_path / "nightly", NIGHTLY_YML, {"run.sh": "echo night\n"})

    async def session() -> None:
        async with stdio_client(server) as mcp:
            await call(mcp, "deploy_worker", folder=str(folder))
            worker = await call(mcp, "get_worker", worker="nightly")
            (trigger,) = worker["triggers"]
            assert trigger["kind"] == "schedule"
            assert [t[-6:] for t in trigger["next_fires"]] == ["+09:00"] * 3
            paused = await call(mcp, "pause_worker", worker="nightly", trigger=trigger["id"])
            assert [t["paused"] for t in paused["items"]] == [True]
            resumed = await call(mcp, "resume_worker", worker="nightly", trigger=trigger["id"])
            assert [t["paused"] for t in resumed["items"]] == [False]
            error = await call_error(mcp, "list_triggers", worker="nope")
            assert error["code"] == "not_found"

    anyio.run(session)


@ONE_DATABASE
def test_the_instructions_say_when_the_key_is_refused_or_floom_cannot_be_asked(
    server: LiveServer,
) -> None:
    with FloomClient(server.base_url, "flm_not_a_key") as refused:
        caller, about = identify(refused, "FLOOM_API_KEY")
    assert caller is None
    assert f"floom at {server.base_url} refused the API key from FLOOM_API_KEY" in about
    assert "flm_not_a_key" not in about
    away = f"http://127.0.0.1:{free_port()}"
    with FloomClient(away, server.admin_key) as unreachable:
        caller, about = identify(unreachable, "FLOOM_API_KEY")
    assert caller is None
    assert f"floom at {away} could not be asked" in about
    assert server.admin_key not in about


@ONE_DATABASE
def test_deploying_a_folder_names_what_was_left_out_as_floom_deploy_does(
    server: LiveServer, tmp_path: Path
) -> None:
    # `floom deploy` printed the environment files and FIFOs it leaves out; the stdio
    # server's deploy_worker and validate_worker left them out without a word.
    folder = make_worker(
        tmp_path / "echo", ECHO_YML, {"run.py": "print('hi')\n", ".env": "TOKEN=x\n"}
    )
    os.mkfifo(folder / "pipe")

    async def session() -> None:
        async with stdio_client(server) as mcp:
            for tool in ("validate_worker", "deploy_worker"):
                said = text_of(await call_raw(mcp, tool, folder=str(folder)))
                assert "left out '.env' (an environment file: store its secrets with" in said
                assert "set_secret" in said
                assert "left out 'pipe' (a FIFO, not a regular file)" in said

    anyio.run(session)
