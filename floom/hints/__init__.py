"""Hints as structured actions: floom's words (an error's message and hint, a notice it logs)
are text and actions (`Action`: an operation of the catalogue, floom.hints.cli, with its
arguments), declared once where they are written; each surface renders an action its own way
(floom.hints.surface): the CLI as a `floom ...` command line (floom.hints.cli), MCP as a tool
call (floom.hints.mcp), a plain REST client as the request (floom.hints.rest), the web UI as
the page and its button (floom.hints.ui). A key the caller should use (`KeyWith`, a scope) is
told as that surface's caller gets and uses one. The words' types are in floom.hints.action;
`told(...)` and `act(...)` build them where an error or notice is written.

What floom stores (a run's error, its notices) is stored as the CLI renders it, the one
notation older versions stored too; reading it back decodes each command by the catalogue's
command lines into the same actions (floom.hints.cli.parse), so a stored notice is rendered
like a live hint."""

from __future__ import annotations

from floom.hints.action import (
    ON_THE_HOST,
    PLACEHOLDER_OF,
    PLACEHOLDERS,
    SERVER_COMMANDS,
    Action,
    Hint,
    KeyWith,
    Part,
    Surface,
    Told,
    Value,
    said,
    told,
)
from floom.hints.cli import act

__all__ = [
    "ON_THE_HOST",
    "PLACEHOLDERS",
    "PLACEHOLDER_OF",
    "SERVER_COMMANDS",
    "Action",
    "Hint",
    "KeyWith",
    "Part",
    "Surface",
    "Told",
    "Value",
    "act",
    "said",
    "told",
]
