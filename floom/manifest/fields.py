"""Checks of a run's input and output values against the fields a worker.yml declares, and the
short renderings of values that manifest problems quote."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from floom import jsonvalues
from floom.cut import cut

if TYPE_CHECKING:
    from floom.manifest.schema import FieldSpec

_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})


def is_number(value: Any) -> bool:
    """A finite JSON number a float holds: an integer too large for one (400 digits, say) is
    not, as its text is not (parse_text), and math.isfinite would raise OverflowError on it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_value(type_: str, value: Any) -> tuple[Any, str | None]:
    """A JSON value checked against a declared field type: (value, None) or (None, error)."""
    if type_ in ("string", "file"):
        ok = isinstance(value, str)
    elif type_ == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_ == "number":
        ok = is_number(value)
    elif type_ == "boolean":
        ok = isinstance(value, bool)
    elif type_ == "object":
        ok = isinstance(value, Mapping)
        value = dict(value) if ok else value
    else:
        ok = isinstance(value, list | tuple)
        value = list(value) if ok else value
    return (value, None) if ok else (None, f"expected {type_}, got {show(value)}")


def parse_text(type_: str, text: str) -> tuple[Any, str | None]:
    """A command-line value parsed by its declared type: (value, None) or (None, error)."""
    stripped = text.strip()
    if type_ in ("string", "file"):
        return text, None
    if type_ in ("integer", "number") and len(stripped) > jsonvalues.MAX_INT_DIGITS:
        return None, f"expected {type_} of at most {jsonvalues.MAX_INT_DIGITS} digits"
    if type_ == "integer" and re.fullmatch(r"[+-]?\d+", stripped):
        return int(stripped), None
    if type_ == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", stripped):
        number = float(stripped)
        if not math.isfinite(number):
            return None, f"expected a finite number, got {show(text)}"
        return (int(number) if re.fullmatch(r"[+-]?\d+", stripped) else number), None
    if type_ == "boolean":
        word = stripped.lower()
        if word in _TRUE_WORDS | _FALSE_WORDS:
            return word in _TRUE_WORDS, None
        return None, f"expected boolean (true/false, yes/no, 1/0), got {show(text)}"
    if type_ in ("object", "array"):
        value, breach = jsonvalues.parse(text, where="the value")
        if breach is not None and breach.limit == "json":
            return None, f"expected {type_} as JSON text, got {show(text)}"
        if breach is not None:
            return None, f"{breach.message} ({breach.limit} bound)"
        return check_value(type_, value)
    return None, f"expected {type_}, got {show(text)}"


def enum_error(spec: FieldSpec, value: Any) -> str | None:
    if spec.enum is None or value is None or value in spec.enum:
        return None
    return f"expected one of {', '.join(map(show, spec.enum))}, got {show(value)}"


def enum_hint(spec: FieldSpec) -> str | None:
    return f"allowed values: {', '.join(map(show, spec.enum))}" if spec.enum else None


def show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return cut(text, 60)


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return show(value)


def suggest(word: str, choices: Iterable[str], *, noun: str = "keys") -> str:
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    if not options:
        return f"there are no {noun} to choose from"
    return f"allowed {noun}: " + ", ".join(options)
