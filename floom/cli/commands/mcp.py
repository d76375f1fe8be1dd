"""`floom mcp`: serve floom's MCP tools over stdio to a coding agent."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `floom mcp` to the floom command."""
    app.command("mcp")(serve_mcp)


def serve_mcp(
    key_file: Annotated[
        str | None,
        typer.Option(
            "--key-file",
            envvar="FLOOM_API_KEY_FILE",
            help="act as the API key in this file (e.g. ~/.floom/admin.key); else FLOOM_API_KEY",
        ),
    ] = None,
) -> None:
    """Serve MCP over stdio for Claude Code, Codex, Gemini CLI, Cursor or VS Code.

    Acts as FLOOM_API_KEY or the key in --key-file, never a key it finds on its own; talks to
    FLOOM_BASE_URL (see docs/how-to/mcp-clients.md).
    """
    # Imported here, not at the top: the MCP SDK costs ~0.4 s of every CLI start-up.
    from floom.mcp.stdio import serve

    serve(key_file=key_file)
