"""The actions floom's hints name, for tests that check every one on every surface: each
`act(...)` written in floom's source (an argument that is not a literal read as its
placeholder), and each operation of the catalogue with each of its arguments and options."""

from __future__ import annotations

import ast
from pathlib import Path

from floom.hints import PLACEHOLDER_OF, Action, Value
from floom.hints.cli import OPS, Arg, Flag, Opt

FLOOM = Path(__file__).resolve().parents[2] / "floom"


def act_calls() -> list[tuple[Path, ast.Call]]:
    """Every call `act(...)` in floom's source, with its module."""
    found = []
    for path in sorted(FLOOM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "act"
            ):
                found.append((path, node))
    return found


def declared_actions() -> set[Action]:
    """The actions floom's source declares, a value it computes read as its placeholder."""
    actions = set()
    for _, call in act_calls():
        first = call.args[0]
        assert isinstance(first, ast.Constant)
        assert isinstance(first.value, str)
        args: list[tuple[str, Value]] = []
        for keyword in call.keywords:
            assert keyword.arg is not None
            value = keyword.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str | bool):
                if value.value is not False:
                    args.append((keyword.arg, value.value))
            else:
                args.append((keyword.arg, PLACEHOLDER_OF.get(keyword.arg, "NAME")))
        actions.add(Action(first.value, tuple(args)))
    return actions


def sample_actions() -> set[Action]:
    """Each operation bare, with each argument or option alone, and with all of them."""
    actions = set()
    for op in OPS.values():
        given: list[tuple[str, Value]] = []
        for token in op.line:
            if isinstance(token, str):
                continue
            value: Value = True if isinstance(token, Flag) else f"x_{token.name}"
            assert isinstance(token, Arg | Opt | Flag)
            given.append((token.name, value))
        actions.add(Action(op.id))
        actions |= {Action(op.id, (one,)) for one in given}
        actions.add(Action(op.id, tuple(given)))
    return actions


def every_action() -> list[Action]:
    return sorted(declared_actions() | sample_actions(), key=repr)
