"""`floom mcp`: serve floom's MCP tools over stdio to a coding agent."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp() -> None:
        """Serve MCP over stdio for Claude Code, Codex, Gemini CLI, Cursor or VS Code.

        Configured by FLOOM_BASE_URL and FLOOM_API_KEY (see the README's MCP section).
        """
        from floom.mcp.stdio import serve

        serve()
