"""A pattern that checks a whole value is applied with `fullmatch`: with `match`, a `$` at
its end also matches before a final newline, so "GITHUB_TOKEN\\n" passed as a secret name,
"reviewer\\n" as a role and "https://x\\n" as a callback URL."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from floom.errors import InvalidRequest
from floom.services.access import secrets
from floom.services.handoffs import agents

FLOOM = Path(__file__).resolve().parents[2] / "floom"


def _anchored_names(tree: ast.Module) -> set[str]:
    """Names bound to `re.compile("...$")` in a module."""
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "compile"
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and str(call.args[0].value).endswith("$")
        ):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def test_no_pattern_ending_in_a_dollar_is_applied_with_match() -> None:
    modules = {path: ast.parse(path.read_text()) for path in FLOOM.rglob("*.py")}
    anchored = set().union(*(_anchored_names(tree) for tree in modules.values()))
    assert {"ROLE_NAME", "NAME_RE"} <= anchored, "the walk no longer sees the patterns"
    wrong = []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "match"
            ):
                continue
            target = node.func.value
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            literal = (
                name == "re"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).endswith("$")
            )
            if name in anchored or literal:
                wrong.append(f"{path.relative_to(FLOOM.parent)}:{node.lineno} {name}.match")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize(
    "check",
    [
        lambda: secrets.check_name("GITHUB_TOKEN\n"),
        lambda: agents._check_role_name("reviewer\n"),
    ],
)
def test_a_name_ending_in_a_newline_is_refused(check: object) -> None:
    with pytest.raises(InvalidRequest):
        check()  # type: ignore[operator]
