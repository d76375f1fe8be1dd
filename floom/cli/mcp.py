"""`floom mcp`: serve floom's MCP tools over stdio to a coding agent."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `floom mcp` to the floom command."""
    app.command("mcp")(serve_mcp)


def serve_mcp() -> None:
    """Serve MCP over stdio for Claude Code, Codex, Gemini CLI, Cursor or VS Code.

    Configured by FLOOM_BASE_URL and FLOOM_API_KEY (see the README's MCP section).
    """
    # Imported here, not at the top: the MCP SDK costs ~0.4 s of every CLI start-up.
    from floom.mcp.stdio import serve

    serve()
