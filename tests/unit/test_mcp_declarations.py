"""What floom's MCP tools declare, checked without a server: complete status enums, clean
descriptions, and hints retold for an agent as calls of tools that exist."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from pydantic import TypeAdapter, ValidationError

from floom.hints import act
from floom.hints import mcp as hints
from floom.mcp.server import FloomMCPServer
from floom.mcp.tools import core as mcp_tools
from floom.services.handoffs import rules as handoff_rules
from floom.services.runs import approvals
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.vocabulary import ApprovalStatus, JobPriority, JobStatus, RunStatus, RunTrigger
from tests.support.hints import every_action


def test_every_status_enum_a_tool_takes_lists_every_status_the_services_know() -> None:
    server = FloomMCPServer(backend_for=_no_backend, load_workers=list)
    schemas = {t.name: t.input_schema["properties"] for t in anyio.run(server.list_tools)}

    def listed(tool: str, argument: str) -> list[str]:
        (word, _null) = schemas[tool][argument]["anyOf"]
        assert word["type"] == "string"
        return list(word["enum"])

    # The vocabulary's words, inline in the tool's schema, in the enum's order.
    assert listed("list_runs", "status") == [w.value for w in RunStatus] == list(run_rules.STATUSES)
    assert listed("list_runs", "trigger") == [w.value for w in RunTrigger] == list(runs.TRIGGERS)
    assert listed("list_approvals", "status") == [w.value for w in ApprovalStatus]
    assert set(approvals.APPROVAL_STATUSES) == set(ApprovalStatus)
    jobs = schemas["handoff_list_jobs"]["status"]["anyOf"][0]["items"]["enum"]
    assert jobs == [w.value for w in JobStatus] == list(handoff_rules.STATUSES)
    assert schemas["handoff_set_status"]["status"]["enum"] == jobs
    assert schemas["handoff_create_job"]["priority"]["enum"] == [w.value for w in JobPriority]


def test_a_word_outside_the_set_is_refused_as_a_literal_refuses_it() -> None:
    argument = TypeAdapter(mcp_tools.RunStatusArg)
    assert type(argument.validate_python("failed")) is RunStatus
    with pytest.raises(ValidationError) as refused:
        argument.validate_python("done")
    (error,) = refused.value.errors()
    assert error["type"] == "literal_error"
    assert error["msg"].startswith("Input should be 'queued', 'running'")


def test_tool_descriptions_are_clean_text_without_source_indentation() -> None:
    server = FloomMCPServer(backend_for=_no_backend, load_workers=list)
    listed = anyio.run(server.list_tools)
    assert {t.name for t in listed} == mcp_tools.TOOL_NAMES
    for tool in listed:
        assert tool.description
        assert tool.description == tool.description.strip()
        assert not re.search(r"\n\s", tool.description), tool.name


def test_a_folder_argument_is_offered_only_by_a_server_on_the_callers_machine() -> None:
    def offered(reads_local_folders: bool) -> dict[str, set[str]]:
        server = FloomMCPServer(
            backend_for=_no_backend, load_workers=list, reads_local_folders=reads_local_folders
        )
        listed = anyio.run(server.list_tools)
        return {t.name: set(t.input_schema.get("properties") or {}) for t in listed}

    inside, local = offered(False), offered(True)
    assert {n for n, args in inside.items() if "folder" in args} == set()
    assert {n for n, args in local.items() if "folder" in args} == set(mcp_tools.LOCAL_ARGUMENTS)
    assert set(mcp_tools.LOCAL_ARGUMENTS) == {"deploy_worker", "validate_worker"}
    for name in mcp_tools.LOCAL_ARGUMENTS:
        assert "files" in inside[name]
        assert inside[name] == local[name] - {"folder"}


def test_every_action_a_hint_names_is_a_tool_that_exists_or_said_to_be_one() -> None:
    operators = set()
    for action in every_action():
        told = hints.action(action)
        if action.op in hints.NO_TOOL:
            if action.op == "mcp":
                assert told == "`floom mcp`"  # the stdio server, named where it is explained
                continue
            # No tool does it (keys, agents, serve): the agent is told it is the operator's.
            assert told.endswith("; no MCP tool does it)"), told
            operators.add(action.op.split()[0])
            continue
        tool = told.split("(")[0]
        assert tool in mcp_tools.TOOL_NAMES, (action, told)
    assert {"keys", "agents", "serve", "backup"} <= operators
    assert hints.action(act("backup")) == (
        "`floom backup` (an operator's command, run on the floom server's host; no MCP tool "
        "does it)"
    )


def _no_backend(_ctx: Any) -> Any:
    raise AssertionError("listing tools needs no backend")
