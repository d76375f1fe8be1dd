"""What each caller is told: floom's own words (error hints, a run's stored error, the notices
it logs into a run) name the action as a CLI command in backticks, the one notation they are
written and stored in (floom.hints); every answer retells them for the surface it goes to.

A plain REST client gets the REST request, an MCP client the tool, a person at the web UI the
page and its button, floom's CLI the command as written; floom's internals act on codes, not
words. Retelling when answering, not when storing, also covers what older versions stored."""

from __future__ import annotations

from collections.abc import Callable

from floom.hints.mcp import for_mcp
from floom.hints.rest import for_rest
from floom.hints.ui import for_ui
from floom.services.access.principal import Surface

_RETELL: dict[Surface, Callable[[str | None], str | None]] = {
    "rest": for_rest,
    "mcp": for_mcp,
    "ui": for_ui,
}


def tell(text: str | None, *, surface: Surface) -> str | None:
    """`text` with each `floom ...` command retold for a caller on `surface`."""
    retell = _RETELL.get(surface)
    return retell(text) if retell is not None else text
