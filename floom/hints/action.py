"""The words of a hint: text and actions (an operation of the catalogue, floom.hints.cli, with
its arguments), and what every surface shares in rendering them."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

# Where a call came in, so that refusals and hints can name what that caller can use.
Surface = Literal["rest", "cli", "mcp", "ui", "system"]
Value = str | bool


@dataclass(frozen=True)
class Action:
    """One operation of the catalogue (floom.hints.cli.OPS) and the arguments given to it;
    an argument not given reads as its placeholder (WORKER)."""

    op: str
    args: tuple[tuple[str, Value], ...] = ()

    def given(self, name: str) -> Value | None:
        return dict(self.args).get(name)

    def flag(self, name: str) -> bool:
        return self.given(name) is True

    def has(self, name: str) -> bool:
        return self.given(name) is not None

    def arg(self, name: str) -> str:
        """The argument's value, or its placeholder when not given (a flag is no value)."""
        value = self.given(name)
        return value if isinstance(value, str) else PLACEHOLDER_OF.get(name, name.upper())


@dataclass(frozen=True)
class KeyWith:
    """An API key with `scope` (or higher), for the caller to use: each surface says how its
    caller gets one and uses it (the CLI the command that creates it, a REST client the
    request, an MCP client that its configuration holds the key, a person at the UI that
    they sign in with it)."""

    scope: str


Part = str | Action | KeyWith


@dataclass(frozen=True)
class Hint:
    """Text, actions and keys to use, in the order they are said."""

    parts: tuple[Part, ...]

    @classmethod
    def of(cls, told: str | Hint) -> Hint:
        return told if isinstance(told, Hint) else cls((told,))

    def actions(self) -> list[Action]:
        return [p for p in self.parts if isinstance(p, Action)]

    def render(self, action: Callable[[Action], str], key: Callable[[KeyWith], str]) -> str:
        return "".join(
            p if isinstance(p, str) else action(p) if isinstance(p, Action) else key(p)
            for p in self.parts
        )


Told = str | Hint


def told(*parts: Part) -> Hint:
    """A hint or message of text and actions: told("resume it with ", act("resume", ...))."""
    return Hint(tuple(p for p in parts if p != ""))


# An argument's placeholder in what a surface shows when the hint does not name its value.
PLACEHOLDER_OF = {
    "worker": "WORKER",
    "run_id": "RUN_ID",
    "version": "VERSION",
    "name": "NAME",
    "comment": "WHY",
    "approval_id": "APPROVAL_ID",
    "folder": "FOLDER",
    "model": "MODEL",
    "scope": "SCOPE",
    "role": "ROLE",
    "roles": "ROLES",
}
# The placeholders stay bare (not quoted, not percent-encoded) in what a surface shows.
# (VALUE: a secret's value, which a hint never holds; NEW_NAME: a secret's new name.)
PLACEHOLDERS = frozenset(PLACEHOLDER_OF.values()) | {"VALUE", "NEW_NAME"}
# Commands given at the shell of the server's host (start, check, back up, move a node's store):
# no page, tool or endpoint does them.
SERVER_COMMANDS = frozenset(
    {"serve", "backup", "restore", "migrate-store", "doctor", "retention", "blobs"}
)
ON_THE_HOST = "an operator's command, run on the floom server's host"


def said(line: Iterable[str], what: str) -> str:
    """The command as the CLI writes it, with what it is: for a surface that has nothing
    doing it."""
    return f"`floom {shlex.join(line)}` ({what})"
