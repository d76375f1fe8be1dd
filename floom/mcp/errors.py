"""The one place where floom's errors become MCP tool errors and resource errors."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from floom.errors import FloomError, InvalidRequest, NotFound
from floom.hints.mcp import for_mcp
from floom.schemas.common import ErrorDetail

log = logging.getLogger("floom.mcp")

#: What a backend raises for a refusal the caller can act on.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (FloomError,)


def describe(exc: BaseException) -> ErrorDetail:
    """The code, message, hint (and details) of a floom error; a generic one for anything
    else, whose text stays in the server log because it may hold internals."""
    if isinstance(exc, FloomError):
        # The services name CLI commands; an agent over MCP gets the tools that do the same.
        tell = (lambda text: text) if exc.as_written else for_mcp
        details = {} if exc.details is None else {"details": exc.details}
        return ErrorDetail(
            code=exc.code, message=tell(exc.message) or "", hint=tell(exc.hint), **details
        )
    log.error("MCP tool failed unexpectedly", exc_info=exc)
    return ErrorDetail(
        code="internal",
        message="floom hit an unexpected error",
        hint="the log of the floom MCP server has the details",
    )


def error_text(error: ErrorDetail) -> str:
    lines = [f"error [{error.code}]: {error.message}"]
    for item in error.details if isinstance(error.details, list) else []:
        if isinstance(item, dict) and item.get("message") and item["message"] not in error.message:
            where = f"{item['path']}: " if item.get("path") else ""
            lines.append(f"  {where}{item['message']}")
    if error.hint:
        lines.append(f"hint: {error.hint}")
    return "\n".join(lines)


# A tool call as floom.hints.mcp writes one: name(arguments), where files={...} may hold braces.
_TOOL_CALL = re.compile(r"\b([a-z][a-z0-9_]*)\((?:[^()]*)\)")


def for_scope(result: CallToolResult, lacked: Callable[[str], str | None]) -> CallToolResult:
    """An error result whose hint names each tool the caller may not call together with the
    scope it needs: a key does not see such a tool in tools/list, and calling it is refused."""
    body = (result.structured_content or {}).get("error") if result.is_error else None
    if not isinstance(body, dict):
        return result
    error = ErrorDetail.model_validate(body)
    if error.hint is None:
        return result

    def mark(match: re.Match[str]) -> str:
        scope = lacked(match.group(1))
        if scope is None:
            return match.group(0)
        return f"{match.group(0)} (a tool for a key with the '{scope}' scope, which this key lacks)"

    hint = _TOOL_CALL.sub(mark, error.hint)
    if hint == error.hint:
        return result
    told = error.model_copy(update={"hint": hint})
    return CallToolResult(
        content=[TextContent(type="text", text=error_text(told))],
        structured_content={**(result.structured_content or {}), "error": told.to_json()},
        is_error=True,
    )


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
        f"there is no tool named '{name}'",
        hint="list the tools again: workers exposed as tools come and go with deploys",
    )


def bad_arguments(tool: str, exc: ToolError) -> FloomError:
    """The SDK's refusal of a call's arguments, as floom's invalid_request error."""
    cause = exc.__cause__
    if not isinstance(cause, ValidationError):
        return InvalidRequest(f"{tool} refused the call", hint="check the tool's input schema")
    problems = [
        {"path": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in cause.errors()
    ]
    return InvalidRequest(
        f"invalid arguments for {tool}: "
        + "; ".join(f"{p['path']}: {p['message']}" for p in problems),
        hint=f"check the input schema of {tool} in the tool list",
        details=problems,
    )
