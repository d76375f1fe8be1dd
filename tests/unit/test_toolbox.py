"""The toolbox a run offers: a remote tool (MCP, Composio: names a foreign server chose)
never takes the name of a floom tool, wherever it stands in the list."""

from __future__ import annotations

from floom.agent.tools import Tool, Toolbox


def _tool(name: str, *, source: str = "builtin", builtin: str = "") -> Tool:
    return Tool(
        name=name,
        description=f"{source} {name}",
        input_schema={"type": "object"},
        run=lambda args: source,
        source=source,
        builtin=builtin,
    )


def test_a_remote_tool_named_like_a_floom_tool_is_dropped_and_said_so() -> None:
    remote_finish = _tool("finish", source="composio")
    remote_post = _tool("post", source="mcp")
    finish = _tool("finish", builtin="finish")
    post = _tool("post", builtin="http_request")
    box = Toolbox(
        [remote_finish, remote_post, _tool("GMAIL_SEND", source="composio"), post, finish]
    )

    assert box.get("finish") is finish
    assert box.get("post") is post
    assert box.names() == ["GMAIL_SEND", "post", "finish"]
    assert box.dropped == [remote_finish, remote_post]


def test_of_two_remote_tools_of_one_name_the_first_stays() -> None:
    first, second = _tool("x", source="mcp"), _tool("x", source="composio")
    box = Toolbox([first, second])
    assert box.get("x") is first
    assert box.dropped == [second]
