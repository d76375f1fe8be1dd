"""What each caller is told: floom's words (error messages and hints, a run's stored error,
the notices it logs) are text and actions (floom.hints), and every answer renders them for the
surface it goes to.

A plain REST client gets the REST request, an MCP client the tool, a person at the web UI the
page and its button, floom's CLI the command; floom's internals act on codes, not words. What
floom stored is read back into actions when answering (floom.hints.cli.parse), which also
covers what older versions stored."""

from __future__ import annotations

from collections.abc import Callable

from floom.hints import Hint, Surface, Told
from floom.hints import cli as cli_hints
from floom.hints import mcp as mcp_hints
from floom.hints import rest as rest_hints
from floom.hints import ui as ui_hints
from floom.hints.rest import Request

_RENDER: dict[Surface, Callable[[Hint], str | None]] = {
    "rest": rest_hints.render,
    "mcp": mcp_hints.render,
    "ui": ui_hints.render,
}


def render(
    told: Told | None,
    *,
    surface: Surface,
    lacked_tool: Callable[[str], str | None] | None = None,
    lacked_request: Callable[[Request], str | None] | None = None,
) -> str | None:
    """Words floom says for a caller on `surface` (plain text is said as it is); with
    `lacked_*`, an action the caller's key may not take names the scope it needs."""
    if told is None or told == "":
        return told
    hint = Hint.of(told)
    if surface == "mcp":
        return mcp_hints.render(hint, lacked_tool)
    if surface == "rest":
        return rest_hints.render(hint, lacked_request)
    return _RENDER.get(surface, cli_hints.render)(hint)


def tell(text: str | None, *, surface: Surface) -> str | None:
    """A stored text (in the CLI's notation) as told to a caller on `surface`."""
    return render(cli_hints.parse(text), surface=surface) if text else text
