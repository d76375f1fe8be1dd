"""The floom command line: a thin client of the REST API, plus `serve`, which runs the server.

One module per command group; `index` lists them and is the entry point, `command` loads only
the group a command line names, `quick` serves the common `floom run` lines without typer;
`output` prints, `common` holds the configured client.
"""

from __future__ import annotations

from floom.cli.index import main

__all__ = ["main"]
