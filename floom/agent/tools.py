"""The tool seam: what the model sees of a tool, and how a call runs.

A tool's `run` takes the model's arguments and returns the text result the model reads. It
raises ToolError for a failure the model should read and may recover from (bad arguments, a
refused address, an HTTP error); anything else it raises is a bug, reported to the model as
an internal error and recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from floom.errors import ToolError
from floom.vocabulary import ToolCallStatus

__all__ = ["RecordedToolError", "Tool", "ToolError", "Toolbox", "object_schema", "require_str"]


class RecordedToolError(ToolError):
    """A failed call whose stored status is not plain "error": a replay answering with a
    recorded rejection, or refusing a call it cannot answer from the recording ("refused")."""

    def __init__(self, message: str, *, call_status: ToolCallStatus) -> None:
        super().__init__(message)
        self.call_status = call_status


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[dict[str, Any]], str] = field(compare=False)
    gated: bool = False
    source: str = "builtin"
    # The builtin behind the tool ("finish", "request_approval", ...); "" for remote tools.
    builtin: str = ""

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


class Toolbox:
    """The tools one run may use; the model is shown exactly these.

    Of tools of one name, floom's own (source "builtin": finish, read_state and the
    builtins worker.yml lists) wins wherever it stands; else the first. A remote tool's name
    is chosen by a foreign server (an MCP server, Composio): it must never take the place of
    `finish` or of a gated builtin. The tools left out are in `dropped`, for the run's log."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        listed = list(tools)
        winners: dict[str, Tool] = {}
        for tool in listed:
            if tool.source == "builtin":
                winners.setdefault(tool.name, tool)
        for tool in listed:
            winners.setdefault(tool.name, tool)
        self._tools: dict[str, Tool] = {}
        self.dropped: list[Tool] = []
        for tool in listed:
            if winners[tool.name] is tool and tool.name not in self._tools:
                self._tools[tool.name] = tool
            else:
                self.dropped.append(tool)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition() for tool in self._tools.values()]


def object_schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def require_str(args: dict[str, Any], name: str, *, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str) or (default is None and not value):
        raise ToolError(f"'{name}' must be a non-empty string")
    return value
