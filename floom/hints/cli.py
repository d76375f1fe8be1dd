"""The catalogue of operations a hint can name, each declared by its command line in floom's
CLI (an operation's id is its command's words: "secrets set"), and the CLI's rendering of an
action: the command in backticks, `floom secrets set GITHUB_TOKEN`.

The command lines are also how floom stores what it said (a run's error, its notices): `parse`
reads a stored text back into text and actions, matching each `floom ...` command against
these lines, so what was stored is rendered on every surface like a live hint."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from floom.hints.action import Action, Hint, KeyWith, Told, Value


@dataclass(frozen=True)
class Arg:
    """A positional argument, written when given."""

    name: str


@dataclass(frozen=True)
class Opt:
    """An option with a value (`--to VERSION`), written when given."""

    flag: str
    name: str


@dataclass(frozen=True)
class Flag:
    """An option without a value (`--force`), written when true."""

    flag: str
    name: str


Token = str | Arg | Opt | Flag


@dataclass(frozen=True)
class Op:
    """An operation: the command's words, then its arguments and options in the order the
    CLI writes them."""

    words: tuple[str, ...]
    line: tuple[Token, ...] = ()

    @property
    def id(self) -> str:
        return " ".join(self.words)

    def names(self) -> set[str]:
        return {t.name for t in self.line if not isinstance(t, str)}

    def write(self, action: Action) -> list[str]:
        out = list(self.words)
        for token in self.line:
            if isinstance(token, str):
                out.append(token)
            elif isinstance(token, Flag):
                out += [token.flag] if action.flag(token.name) else []
            else:
                value = action.given(token.name)
                if isinstance(value, str):
                    out += [token.flag, value] if isinstance(token, Opt) else [value]
        return out

    def read(self, words: list[str]) -> Action | None:
        """The action `words` (a command's words after `floom`) write, or None."""
        if words[: len(self.words)] != list(self.words):
            return None
        at, args = len(self.words), dict[str, Value]()
        for i, token in enumerate(self.line):
            here = words[at] if at < len(words) else None
            if isinstance(token, str):
                if here != token:
                    return None
                at += 1
            elif isinstance(token, Flag):
                if here == token.flag:
                    args[token.name], at = True, at + 1
            elif isinstance(token, Opt):
                if here == token.flag and at + 1 < len(words):
                    args[token.name], at = words[at + 1], at + 2
            elif here is not None and not here.startswith("-") and here not in self.line[i:]:
                args[token.name], at = here, at + 1
        return Action(self.id, tuple(args.items())) if at == len(words) else None


def _op(words: str, *line: Token) -> Op:
    return Op(tuple(words.split()), line)


WORKER, RUN, NAME = Arg("worker"), Arg("run_id"), Arg("name")
AGAINST = Opt("--against", "version")

OPS: dict[str, Op] = {
    op.id: op
    for op in [
        # Workers, their versions and deploys
        _op("workers"),
        _op("deploy", Arg("folder"), Flag("--skip-eval-gate", "skip_eval_gate")),
        _op("versions", WORKER),
        _op("rollback", WORKER, Opt("--to", "version"), Opt("--run", "run_id")),
        _op("pause", WORKER),
        _op("resume", WORKER),
        _op("triggers", WORKER),
        _op("deliveries", WORKER),
        _op("state get", WORKER),
        _op("state history", WORKER),
        _op("state set", WORKER, "..."),
        _op("eval", WORKER, AGAINST),
        # Runs
        _op("run", WORKER, Flag("--force", "force")),
        _op("runs", Opt("--worker", "worker")),
        _op("runs show", RUN),
        _op("show", RUN),
        _op("logs", Flag("-f", "follow"), RUN),
        _op(
            "replay",
            RUN,
            Flag("--latest", "latest"),
            Flag("--exact", "exact"),
            AGAINST,
            Opt("--model", "model"),
        ),
        _op("approvals"),
        _op("approve", Arg("approval_id")),
        _op("reject", Arg("approval_id"), Opt("--comment", "comment")),
        # Secrets, keys, agents and roles
        _op("secrets list"),
        _op("secrets set", NAME),
        _op("secrets rm", NAME),
        _op("keys list"),
        _op("keys create", Opt("--scope", "scope")),
        _op("agents list"),
        _op("agents create", NAME, Opt("--role", "role")),
        _op("roles list"),
        _op("handoffs list"),
        _op("handoffs claim-next"),
        # Alerts
        _op("alerts channels"),
        _op("alerts channels add", NAME, "..."),
        _op("alerts channels rm", NAME),
        _op("alerts rules"),
        _op("alerts deliveries"),
        # The node: run at the server's host, or on the agent's own machine (mcp)
        _op("serve", Opt("--roles", "roles")),
        _op("nodes"),
        _op("backup"),
        _op("migrate-store"),
        _op("retention compact"),
        _op("blobs check"),
        _op("blobs migrate", Opt("--to", "to")),
        _op("blobs held-back", Flag("--retry", "retry")),
        _op("blobs give-up", Flag("--all", "all")),
        _op("mcp"),
    ]
}


def act(op: str, **args: Value | None) -> Action:
    """An action of operation `op` with the arguments given (None and False are left out:
    not given): told("resume it with ", act("resume", worker=name))."""
    known = OPS.get(op)
    if known is None:
        raise ValueError(f"no operation {op!r} in floom.hints.cli.OPS")
    unknown = set(args) - known.names()
    if unknown:
        raise ValueError(f"operation {op!r} takes no argument {sorted(unknown)}")
    return Action(op, tuple((k, v) for k, v in args.items() if v is not None and v is not False))


# Tried with the longest command first: `floom runs show r_1` is not `floom runs`.
_BY_LENGTH = sorted(OPS.values(), key=lambda op: -len(op.words))


def line(action: Action) -> list[str]:
    """The action's command words after `floom`."""
    return OPS[action.op].write(action)


def command(action: Action) -> str:
    """The action as the CLI writes it: `floom secrets set GITHUB_TOKEN`."""
    return f"`floom {shlex.join(line(action))}`"


def key(needed: KeyWith) -> str:
    """A key to use, as the CLI says it: the command that creates one."""
    return f"a key created with {command(act('keys create', scope=needed.scope))} (or higher)"


def render(told: Hint | None) -> str | None:
    return told.render(command, key) if told is not None else None


def written(told: Told) -> str:
    """Words as the CLI writes them (and floom stores them)."""
    return told if isinstance(told, str) else told.render(command, key)


# A command in the CLI's notation, as floom stores it in what it said.
_COMMAND = re.compile(r"`floom ([^`]*)`")


def read(words: list[str]) -> Action | None:
    """The catalogue's action whose command line `words` are, or None."""
    return next((a for op in _BY_LENGTH if (a := op.read(words)) is not None), None)


def parse(text: str) -> Hint:
    """A stored text (written as the CLI renders it) as text and actions; a command the
    catalogue does not know stays text."""
    parts: list[str | Action] = []
    at = 0
    for found in _COMMAND.finditer(text):
        try:
            action = read(shlex.split(found.group(1)))
        except ValueError:
            action = None
        if action is None:
            continue
        parts += [text[at : found.start()], action]
        at = found.end()
    parts.append(text[at:])
    return Hint(tuple(p for p in parts if p != ""))
