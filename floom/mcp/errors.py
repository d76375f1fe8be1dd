"""The one place where floom's errors become MCP tool errors and resource errors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from floom.errors import FloomError, InvalidRequest, NotFound, quoted
from floom.hints import Surface
from floom.hints.surface import render
from floom.mcp.render import said
from floom.schemas.common import ErrorDetail

log = logging.getLogger("floom.mcp")

#: What a backend raises for a refusal the caller can act on.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (FloomError,)
# During one tool call over HTTP: the scope a tool needs when the caller's key lacks it, so
# that a hint naming that tool says so (a key does not see such a tool in tools/list).
_LACKED: ContextVar[Callable[[str], str | None] | None] = ContextVar("lacked", default=None)


@contextmanager
def scoped_hints(lacked: Callable[[str], str | None]) -> Iterator[None]:
    """Within: every error's hint names, beside each tool it recommends that the caller may
    not call, the scope that tool needs."""
    token = _LACKED.set(lacked)
    try:
        yield
    finally:
        _LACKED.reset(token)


def describe(exc: BaseException) -> ErrorDetail:
    """The code, message, hint (and details) of a floom error; a generic one for anything
    else, whose text stays in the server log because it may hold internals."""
    if isinstance(exc, FloomError):
        # An agent over MCP gets the tools that do what a hint recommends (floom.hints.mcp);
        # an error written for the person at this machine's shell keeps its commands.
        surface: Surface = "cli" if exc.as_written else "mcp"
        lacked = _LACKED.get()
        told = exc.details_for(lambda hint: render(hint, surface=surface, lacked_tool=lacked))
        details = {} if told is None else {"details": told}
        return ErrorDetail(
            code=exc.code,
            message=render(exc.said, surface=surface) or "",
            hint=render(exc.advice, surface=surface, lacked_tool=lacked),
            **details,
        )
    if isinstance(exc, ValidationError):  # a request model refused the tool's arguments
        return describe(refused_request(exc))
    log.error("MCP tool failed unexpectedly", exc_info=exc)
    return ErrorDetail(
        code="internal",
        message="floom hit an unexpected error",
        hint="the log of the floom MCP server has the details",
    )


def error_text(error: ErrorDetail) -> str:
    """An error as a reply's text. Its message and details are floom's words, but they may
    quote what a caller or a worker wrote (a name not found, a manifest's path): each is
    said on one line (render.said), so none can add a line that reads as floom's."""
    lines = [f"error [{error.code}]: {said(error.message)}"]
    for item in error.details if isinstance(error.details, list) else []:
        if isinstance(item, dict) and item.get("message") and item["message"] not in error.message:
            where = f"{said(str(item['path']))}: " if item.get("path") else ""
            lines.append(f"  {where}{said(str(item['message']))}")
    if error.hint:
        lines.append(f"hint: {error.hint}")
    return "\n".join(lines)


def tool_error(exc: BaseException) -> CallToolResult:
    """A tool error (isError) carrying floom's code and hint, as text and structured content."""
    error = describe(exc)
    return CallToolResult(
        content=[TextContent(type="text", text=error_text(error))],
        structured_content={"error": error.to_json()},
        is_error=True,
    )


def resource_error(exc: BaseException) -> ResourceError:
    """The error to raise from a resource read (a protocol error: resources have no isError)."""
    error = describe(exc)
    text = error_text(error).replace("\n", "; ")
    if error.code == "not_found":
        return ResourceNotFoundError(text)
    return ResourceError(text)


def unknown_tool(name: str) -> NotFound:
    return NotFound(
        f"there is no tool named '{quoted(name)}'",
        hint="list the tools again: workers exposed as tools come and go with deploys",
    )


def refused_request(exc: ValidationError, tool: str = "") -> FloomError:
    """A refusal of what a tool was given (by the SDK, or by a request model of floom/schemas
    that the tool built from it), as floom's invalid_request error."""
    problems = [
        {"path": ".".join(str(p) for p in loc), "message": msg}
        for loc, msg in ((e["loc"], e["msg"]) for e in exc.errors())
    ]
    return InvalidRequest(
        f"invalid arguments{f' for {tool}' if tool else ''}: "
        + "; ".join(f"{p['path']}: {p['message']}" for p in problems),
        hint=f"check the input schema of {tool or 'the tool'} in the tool list",
        details=problems,
    )


def bad_arguments(tool: str, exc: ToolError) -> FloomError:
    """The SDK's refusal of a call's arguments, as floom's invalid_request error."""
    cause = exc.__cause__
    if not isinstance(cause, ValidationError):
        return InvalidRequest(f"{tool} refused the call", hint="check the tool's input schema")
    return refused_request(cause, tool)
