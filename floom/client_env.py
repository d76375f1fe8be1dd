"""Where a client (the CLI, the stdio MCP server) finds its server and key, read straight from
the environment: a client command must not pay for the server's settings model (~0.1 s)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8321


def _env(name: str) -> str | None:
    # Case-insensitive, as the server's pydantic settings read the same variables.
    for key, value in os.environ.items():
        if key.upper() == name:
            return value
    return None


def client_base_url() -> str:
    """The base URL the CLI and the stdio MCP server talk to."""
    url = _env("FLOOM_BASE_URL")
    if url:
        return url.rstrip("/")
    port = _env("FLOOM_PORT") or str(DEFAULT_PORT)
    return f"http://127.0.0.1:{port}"


def admin_key_file() -> Path:
    """Where a local server keeps its admin key (FLOOM_DATA_DIR/admin.key)."""
    data_dir = _env("FLOOM_DATA_DIR")
    return (Path(data_dir) if data_dir else Path.home() / ".floom") / "admin.key"
