"""What the floom command groups share: the configured REST client and common options."""

from __future__ import annotations

from typing import Annotated

import typer

from floom.client import FloomClient
from floom.handoff_client import HandoffClient

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON only")]


def open_client() -> FloomClient:
    """The REST client that FLOOM_BASE_URL and FLOOM_API_KEY configure, speaking as the CLI."""
    return FloomClient.from_env(surface="cli")


class HandoffSession:
    """The CLI's configured client, as a HandoffClient, closed on exit."""

    def __enter__(self) -> HandoffClient:
        self._client = open_client()
        return HandoffClient(self._client)

    def __exit__(self, *exc: object) -> None:
        self._client.close()
