"""Hints name the CLI command that fixes a problem (`floom resume hello`), and so do the
run errors and log notices floom stores; each surface retells them for its caller when it
answers (floom.hints.surface): the MCP tool over MCP (floom.hints.mcp), the REST endpoint for
a plain REST client (floom.hints.rest), the command itself for the CLI. This module finds the
commands in a text and reads their words; each surface brings its own table."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping

# What a surface says of a command it has nothing for starts with one of these (said() checks);
# a command already so said is not retold again (an error told by the server for MCP passes
# through the stdio server's retelling too).
SAID = ("an operator's command", "an admin's command", "a command of the floom CLI", "the MCP ")
CLI_COMMAND = re.compile(
    r"`floom ([^`]*)`(?! \((?:" + "|".join(re.escape(opening) for opening in SAID) + "))"
)
# A command's words after its name; None leaves the command as it is (an operator runs it).
Render = Callable[[list[str]], str | None]
# The CLI's placeholders ({name} already filled in) stay bare in what a surface shows.
PLACEHOLDERS = frozenset(
    {
        "WORKER",
        "RUN_ID",
        "RUN",
        "VERSION",
        "NAME",
        "VALUE",
        "WHY",
        "APPROVAL_ID",
        "ID",
        "FOLDER",
        "MODEL",
    }
)
# Commands given at the shell of the server's host (start, check, back up, move a node's store):
# no page, tool or endpoint does them.
SERVER_COMMANDS = frozenset({"serve", "backup", "restore", "migrate-store", "doctor", "retention"})
ON_THE_HOST = "an operator's command, run on the floom server's host"


def retell(
    text: str | None, table: Mapping[str, Render], *, otherwise: Render | None = None
) -> str | None:
    """`text` with each `floom COMMAND ...` that `table` knows replaced by its rendering;
    `otherwise` renders the rest (given all the command's words, its name first)."""

    def one(match: re.Match[str]) -> str:
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            return match.group(0)
        render = table.get(words[0]) if words else None
        if render is not None:
            told = render(words[1:])
        else:
            told = otherwise(words) if otherwise is not None and words else None
        return match.group(0) if told is None else told

    return CLI_COMMAND.sub(one, text) if text else text


def said(words: list[str], what: str) -> str:
    """The command as written, with what it is: for a surface that has nothing doing it."""
    if not what.startswith(SAID):
        raise ValueError(f"what a command is starts with one of {SAID}: {what!r}")
    return f"`floom {shlex.join(words)}` ({what})"


def first(words: list[str], default: str) -> str:
    """The command's first word when it is not an option (a worker, a run id), or `default`."""
    return words[0] if words and not words[0].startswith("-") else default


def option(words: list[str], name: str, default: str) -> str:
    """The value after option `name` (`--to VERSION`), or `default`."""
    if name in words and words.index(name) + 1 < len(words):
        return words[words.index(name) + 1]
    return default
