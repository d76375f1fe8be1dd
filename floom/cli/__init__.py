"""The floom command line: a thin client of the REST API, plus `serve`, which runs the server.

One module per command group; `output` prints, `common` holds the configured client.
"""

from __future__ import annotations

from floom.cli.command import app, main

__all__ = ["app", "main"]
