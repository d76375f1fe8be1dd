"""Bounds on the JSON values floom stores from workers and callers (outputs, inputs, tool
calls, approval edits, handoff payloads, webhook bodies, agent state), one checker for every
place they come in, and one reader that shows any stored value without failing.

A value is refused at ingestion when it nests deeper than MAX_DEPTH, has an object of more
than MAX_KEYS keys, a string (or key) of more than MAX_STRING_CHARS characters, an integer of
more than MAX_INT_DIGITS digits, a number that is not finite (NaN, Infinity), a string holding
a lone UTF-16 surrogate (a JSON escape like \\ud800 without its pair: no encoding holds one,
so no store keeps it and no answer can carry it), a type JSON has no word for, or is over the
caller's byte bound as JSON. What is already stored is read with
`stored`, which answers a marker (`{"floom_unreadable": why}`) in place of a value it cannot
show: a row written by an older floom, by hand, or by anything else never breaks a page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from floom.errors import FloomError, InvalidRequest

MAX_DEPTH: Final = 64
MAX_KEYS: Final = 10_000
MAX_STRING_CHARS: Final = 1024 * 1024
# Python's own int <-> str conversion limit (sys.get_int_max_str_digits): a longer integer
# cannot even be printed by the default interpreter.
MAX_INT_DIGITS: Final = 4300
_MAX_INT_BITS: Final = int(MAX_INT_DIGITS * math.log2(10))
# A stored text longer than this is not parsed for a page at all (a reader's own bound).
MAX_STORED_CHARS: Final = 64 * 1024 * 1024
UNREADABLE: Final = "floom_unreadable"

_SCALARS = (str, int, float, bool, type(None))
# A lone surrogate in a string; in JSON text, an escape of one (paired ones included: a
# non-BMP character escaped, as json.dumps writes it, is two of them).
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_TEXT = re.compile("[\ud800-\udfff]|\\\\u[dD][89a-fA-F]")
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Breach:
    """The first bound a value is over: where in it (`outputs.items[3]`), which bound
    (depth, keys, string, number, type, bytes, json) and its maximum."""

    path: str
    limit: str
    max: int | None
    message: str

    def detail(self) -> dict[str, Any]:
        return {"path": self.path, "limit": self.limit, "max": self.max}


# A place in a value, built only when a breach is told: (the parent's trail, key or index).
Trail = tuple[Any, Any] | None
_CONTAINER: Final = object()


def breach_of(
    value: Any, *, where: str, max_bytes: int | None = None, strict_types: bool = True
) -> Breach | None:
    """The first bound `value` is over, or None. Walks without recursion and stops at the
    first breach, so a hostile value costs no more than its part within the bounds.
    `strict_types=False` lets through values JSON has no word for (written as their text)."""
    # A long string is told after the size: over both, the size is the bound to name.
    long_string: Breach | None = None
    kind = _kind(value, strict_types)
    if kind is _CONTAINER:
        stack: list[tuple[Any, int, Trail]] = [(value, 0, None)]
    elif kind is None:
        stack = []
    elif kind == "string":
        stack, long_string = [], _breach("string", where, None, value)
    else:
        return _breach(str(kind), where, None, value)
    while stack:
        item, depth, trail = stack.pop()
        if depth >= MAX_DEPTH:
            return _breach("depth", where, trail, item)
        mapping = isinstance(item, Mapping)
        if mapping:
            if len(item) > MAX_KEYS:
                return _breach("keys", where, trail, item)
            children: Any = item.items()
        else:
            children = enumerate(item)
        for key, child in children:
            if mapping and type(key) is not str:
                return _breach("type", where, trail, key)
            if mapping and _kind(key, strict_types) == "text":
                return _breach("text", where, (trail, key), key)
            if type(key) is str and len(key) > MAX_STRING_CHARS and long_string is None:
                long_string = _breach("string", where, trail, key)
            kind = _kind(child, strict_types)
            if kind is None:
                continue
            if kind is _CONTAINER:
                stack.append((child, depth + 1, (trail, key)))
            elif kind == "string":
                if long_string is None:
                    long_string = _breach("string", where, (trail, key), child)
            else:
                return _breach(str(kind), where, (trail, key), child)
    if max_bytes is not None:
        size = len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))
        if size > max_bytes:
            return Breach(
                where, "bytes", max_bytes, f"{where} is {size} bytes as JSON, over {max_bytes}"
            )
    return long_string


# A JSON escape of a UTF-16 surrogate (`\\ud800`), or one's bytes as UTF-8 would write it
# (json.loads decodes bytes with surrogatepass): how parsed JSON can hold one. A pair of
# escapes is one character; one alone is none.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")


LONE_SURROGATE = "lone UTF-16 surrogate"


def lone_surrogate_said(path: str) -> str:
    """What is wrong with JSON text holding a lone surrogate at `path` (after "the body")."""
    return (
        f"holds a {LONE_SURROGATE} at {path}, which is no character "
        "(\\ud800 to \\udfff come only in pairs, as one character)"
    )


def lone_surrogate(value: Any, *, where: str, text: bytes | str | None = None) -> str | None:
    """Where in parsed JSON `value` a string (or key) holds a lone surrogate, or None. Given
    the `text` it was parsed from, a text without a surrogate (escaped, or decoded from
    bytes with surrogatepass) is not walked."""
    if (
        isinstance(text, bytes)
        and json.detect_encoding(text).startswith("utf-8")
        and not _SURROGATE_ESCAPE.search(text)
    ):
        return None
    if isinstance(text, str) and not (
        _SURROGATE_ESCAPE_TEXT.search(text) or _SURROGATE.search(text)
    ):
        return None
    stack: list[tuple[Any, Trail]] = [(value, None)]
    while stack:
        item, trail = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _path(where, trail)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return _path(where, trail)
                stack.append((child, (trail, key)))
        elif isinstance(item, list):
            stack.extend((child, (trail, i)) for i, child in enumerate(item))
    return None


def _kind(item: Any, strict_types: bool) -> Any:
    """None for a scalar within the bounds, _CONTAINER for a list or mapping, else the name
    of the bound it is over."""
    t = type(item)
    if t is str:
        if len(item) > MAX_STRING_CHARS:
            return "string"
        return None if item.isascii() or _SURROGATE.search(item) is None else "text"
    if t is int:
        return "number" if item.bit_length() > _MAX_INT_BITS else None
    if t is float:
        return None if math.isfinite(item) else "number"
    if item is None or t is bool:
        return None
    if isinstance(item, (Mapping, list, tuple)):
        return _CONTAINER
    # Subclasses (an enum, a bool) are judged as their base type.
    if isinstance(item, bool):
        return None
    for base in (str, int, float):
        if isinstance(item, base):
            return _kind(base(item), strict_types)
    return "type" if strict_types else None


def _path(where: str, trail: Trail) -> str:
    parts: list[str] = []
    while trail is not None:
        trail, key = trail
        # A key is the caller's text: a lone surrogate in it would make the message unsayable.
        shown = f".{_SURROGATE.sub(REPLACEMENT, str(key)[:40])}"
        parts.append(f"[{key}]" if isinstance(key, int) else shown)
    return where + "".join(reversed(parts))


def _breach(limit: str, where: str, trail: Trail, item: Any) -> Breach:
    path = _path(where, trail)
    if limit == "depth":
        return Breach(path, "depth", MAX_DEPTH, f"{where} nests deeper than {MAX_DEPTH} levels")
    if limit == "keys":
        return Breach(path, "keys", MAX_KEYS, f"{path} is an object of more than {MAX_KEYS} keys")
    if limit == "string":
        return Breach(
            path,
            "string",
            MAX_STRING_CHARS,
            f"{path} is a string of more than {MAX_STRING_CHARS} characters",
        )
    if limit == "text":
        return Breach(
            path,
            "text",
            None,
            f"{path} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
            "pair), which is not text",
        )
    if limit == "number" and isinstance(item, int):
        return Breach(
            path,
            "number",
            MAX_INT_DIGITS,
            f"{path} is an integer of more than {MAX_INT_DIGITS} digits",
        )
    if limit == "number":
        return Breach(path, "number", None, f"{path} is {item}, which JSON cannot hold")
    return Breach(path, "type", None, f"{path} is a {type(item).__name__}, which JSON cannot hold")


def check(
    value: Any,
    *,
    where: str,
    max_bytes: int | None = None,
    error: type[FloomError] = InvalidRequest,
    hint: str | None = None,
) -> None:
    """Raise `error` naming the bound when `value` is over one (see breach_of)."""
    found = breach_of(value, where=where, max_bytes=max_bytes)
    if found is not None:
        raise error(
            found.message,
            hint=hint or bounds_hint(),
            details=[found.detail()],
        )


def dumps(value: Any, *, where: str) -> str:
    """`value` as JSON text to store, values JSON has no word for as their text; a value over
    a bound is stored as a marker saying so (the net under every write: what comes from
    outside is refused with `check` before it gets here)."""
    found = breach_of(value, where=where, strict_types=False)
    if found is not None:
        return json.dumps(unreadable(f"not kept: {found.message}"))
    return json.dumps(value, default=str)


def bounds_hint() -> str:
    return (
        f"floom keeps JSON values up to {MAX_DEPTH} levels deep, {MAX_KEYS} keys per object, "
        f"{MAX_STRING_CHARS} characters per string and {MAX_INT_DIGITS} digits per integer, "
        "without NaN, Infinity or a lone surrogate escape (\\ud800 with no \\udc00 after it); "
        "pass larger data as a file"
    )


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(f"{name}, which JSON cannot hold")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotFinite(f"{text[:40]}, too large for a finite number")
    return number


def parse(
    text: str | bytes, *, where: str, max_bytes: int | None = None
) -> tuple[Any, Breach | None]:
    """JSON text from outside floom, parsed within the bounds: (value, None), or (None, the
    breach) when it is not JSON or is over a bound. Never raises for any input."""
    if isinstance(text, bytes):
        try:  # as json.loads reads bytes: UTF-8, or UTF-16/32 told by the first bytes
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        except UnicodeDecodeError as exc:
            return None, Breach(where, "json", None, f"{where} is not valid JSON ({_short(exc)})")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:
        return None, Breach(
            where, "depth", MAX_DEPTH, f"{where} nests deeper than {MAX_DEPTH} levels"
        )
    except _NotFinite as exc:
        return None, Breach(where, "number", None, f"{where} holds {exc}")
    except ValueError as exc:  # also UnicodeDecodeError
        if "integer string conversion" in str(exc):
            return None, Breach(
                where,
                "number",
                MAX_INT_DIGITS,
                f"{where} holds an integer of more than {MAX_INT_DIGITS} digits",
            )
        return None, Breach(where, "json", None, f"{where} is not valid JSON ({_short(exc)})")
    lone = lone_surrogate(value, where=where, text=text)
    if lone is not None:
        return None, Breach(lone, "json", None, f"{where} {lone_surrogate_said(lone)}")
    # Parsed JSON holds only JSON's types and finite numbers; no string can be longer than
    # the text, no object have more keys than it has colons, and only many brackets can
    # nest deep: most values need no walk, or one of their containers only.
    if (
        max_bytes is None
        and len(text) <= MAX_STRING_CHARS
        and text.count(":") <= MAX_KEYS
        and _SURROGATE_TEXT.search(text) is None
    ):
        if _too_deep(text, value):
            return None, Breach(
                where, "depth", MAX_DEPTH, f"{where} nests deeper than {MAX_DEPTH} levels"
            )
        return value, None
    return value, breach_of(value, where=where, max_bytes=max_bytes)


def _short(exc: Exception) -> str:
    return str(exc)[:200]


def unreadable(why: str) -> dict[str, str]:
    """What a page shows in place of a stored value it cannot show."""
    return {UNREADABLE: why}


def _shown_constant(name: str) -> str:
    return name


def _shown_float(text: str) -> float | str:
    number = float(text)
    return number if math.isfinite(number) else text[:40]


def stored(text: Any, *, expect: type | tuple[type, ...] | None = None) -> Any:
    """A stored JSON text as a value any surface can show: None for None; the value when it
    is within the bounds (a NaN or an overflowing float shown as its text) and of the
    `expect`ed type; else a marker saying why (as a one-item list when a list is expected).
    Never raises: every page, export and diff reads stored values through this."""
    value = _stored(text)
    if expect is not None and not isinstance(value, expect) and UNREADABLE not in _keys(value):
        wanted = expect if isinstance(expect, type) else expect[0]
        value = unreadable(f"a {type(value).__name__} was stored where a {_word(wanted)} belongs")
    lists = expect is list or (isinstance(expect, tuple) and list in expect)
    if lists and isinstance(value, dict) and UNREADABLE in value and len(value) == 1:
        return [value]
    return value


def stored_list(text: Any, *, items: type) -> list[Any]:
    """A stored JSON list whose items must be of type `items` (str or dict), each item that
    is not shown as a marker of that type (a dict marker, or its text for a str)."""
    shown_items: list[Any] = []
    for item in stored(text, expect=list):
        if isinstance(item, items):
            shown_items.append(item)
            continue
        why = item.get(UNREADABLE) if isinstance(item, dict) else None
        why = why or f"a {type(item).__name__} was stored where a {_word(items)} belongs"
        shown_items.append(unreadable(why) if items is dict else f"({UNREADABLE}: {why})")
    return shown_items


def _keys(value: Any) -> Any:
    return value if isinstance(value, dict) else ()


def _word(kind: type) -> str:
    words: dict[type, str] = {dict: "object", list: "list", str: "string"}
    return words.get(kind, kind.__name__)


def _stored(text: Any) -> Any:
    if text is None:
        return None
    if not isinstance(text, str):
        return unreadable(f"a {type(text).__name__} was stored where JSON text belongs")
    if len(text) > MAX_STORED_CHARS:
        return unreadable(f"the stored value is over {MAX_STORED_CHARS} characters")
    try:
        value = json.loads(text, parse_constant=_shown_constant, parse_float=_shown_float)
    except RecursionError:
        return unreadable(f"the stored value nests deeper than {MAX_DEPTH} levels")
    except ValueError as exc:
        return unreadable(f"the stored value is not valid JSON ({_short(exc)})")
    if _too_deep(text, value):
        return unreadable(f"the stored value nests deeper than {MAX_DEPTH} levels")
    if _SURROGATE_TEXT.search(text) is not None:
        return sendable(value)  # written by an older floom
    return value


def sendable(value: Any) -> Any:
    """`value` with each lone surrogate in its strings and keys as U+FFFD: no answer, no
    request to a model and no store can carry one (a file name of invalid UTF-8 as Python
    reads it, a JSON escape without its pair). Walked without recursion: a model's reply
    may nest deeper than Python's stack before floom's bounds refuse it."""
    if type(value) is str:
        return value if value.isascii() else _SURROGATE.sub(REPLACEMENT, value)
    if type(value) not in (list, dict) or lone_surrogate(value, where="") is None:
        return value
    root: list[Any] | dict[Any, Any] = [] if type(value) is list else {}
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, copy = stack.pop()
        for key, item in enumerate(source) if type(source) is list else source.items():
            new: Any = item
            if type(item) is str:
                new = _SURROGATE.sub(REPLACEMENT, item)
            elif type(item) in (list, dict):
                new = [] if type(item) is list else {}
                stack.append((item, new))
            if type(copy) is list:
                copy.append(new)
            else:
                copy[_SURROGATE.sub(REPLACEMENT, key) if type(key) is str else key] = new
    return root


def _too_deep(text: str, value: Any) -> bool:
    """Whether parsed JSON `value` nests deeper than MAX_DEPTH: at once when its text has
    fewer brackets than that, else by a walk of its containers only."""
    if text.count("[") + text.count("{") <= MAX_DEPTH or type(value) not in (dict, list):
        return False
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return True
        children = item.values() if type(item) is dict else item
        stack.extend([(c, depth + 1) for c in children if type(c) is dict or type(c) is list])
    return False


def shown(value: Any) -> Any:
    """A value in memory (not stored text) as a page may show it: itself within the bounds,
    else a marker saying why."""
    found = breach_of(value, where="value")
    if found is None:
        return value
    return unreadable(f"the value is over a bound: {found.message}")
