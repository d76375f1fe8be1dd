"""What the floom command groups share: the configured REST client and common options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from floom import jsonvalues
from floom.cli.visible import show_raw
from floom.client.handoffs import HandoffClient
from floom.client.rest import FloomClient

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON only")]


def _raw_output(on: bool) -> bool:
    if on:
        show_raw()
    return on


RawOpt = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="print control characters as they are (by default they show as \\x1b...)",
        callback=_raw_output,
    ),
]


def json_object_option(value: str, *, option: str, example: str) -> dict[str, Any]:
    """A JSON object given on the command line, or read from a file as `@path`; a
    BadParameter naming `option` (and showing `example`) otherwise."""
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {value[1:]}: {exc.strerror}") from exc
    parsed, breach = jsonvalues.parse(text, where="the value")
    if breach is not None:
        raise typer.BadParameter(breach.message, param_hint=option)
    if not isinstance(parsed, dict):
        raise typer.BadParameter(f"expected a JSON object such as {example}", param_hint=option)
    return parsed


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
