"""store.statements.text's fast check (most parameters need no change) agrees with the plain
rule: every NUL and lone surrogate becomes U+FFFD, at any depth, and nothing else changes."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from floom.store.statements.text import storable, storable_parameters

RULE = re.compile("[\x00\ud800-\udfff]")
TEXTS = ["", "id_1", "café", "日本", "\U0001f600", "\x00", "a\x00", "\ud800", "é\udfff", "x\ud83d"]


def plain(value: Any) -> Any:
    if type(value) is str:
        return RULE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map(plain, value))
    return value


def test_each_text_is_made_storable_as_the_plain_rule_makes_it() -> None:
    for text in TEXTS:
        assert storable(text) == plain(text), text
        assert storable(text).encode() == plain(text).encode()


def test_parameters_of_every_shape_are_made_storable_and_kept_when_already_so() -> None:
    now = datetime.now(UTC)
    for text in TEXTS:
        for parameters in [
            (1, text, now, None, b"\x00"),
            {"a": 1, "b": text, "c": None},
            [{"a": "ok", "b": text}, {"a": "ok", "b": "ok"}],
            {"lines": ["ok", text], "n": [1, 2]},
            [("ok", (text,))],
        ]:
            made = storable_parameters(parameters)
            assert made == plain(parameters), parameters
            if made == parameters:
                assert made is parameters  # the fast path hands back the same object
    assert storable_parameters(None) is None


class Parameters(dict[str, Any]):
    """A mapping of another class than dict, as a driver or SQLAlchemy may hand one over."""


def test_parameters_in_subclasses_of_dict_and_list_are_made_storable_too() -> None:
    made = storable_parameters(Parameters(a="x\x00", b=Parameters(c=["\ud800"])))
    assert made == {"a": "x\ufffd", "b": {"c": ["\ufffd"]}}
