"""What both stores keep as text: NUL and lone surrogates become U+FFFD in every string bound
to a statement (db.make_engine applies it), whatever the column, the filter or the batch."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any

# What neither store keeps as text: NUL (PostgreSQL's text refuses it, SQLite's text
# functions stop at one) and a lone UTF-16 surrogate (no encoding holds one: a file name of
# invalid UTF-8 read by Python, a JSON escape like "\\ud800" without its pair). Workers print
# them and callers send them (in a name, an id, a filter); a log line holding a NUL failed a
# run's whole log on PostgreSQL, a lone surrogate in a run's note the record of its end.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable(text: str) -> str:
    """`text` as both stores keep it: NUL and lone surrogates become U+FFFD, as an undecodable
    byte of a run's output does."""
    if _is_storable(text):
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def _is_storable(text: str) -> bool:
    # Most bound strings are ASCII (ids, words, JSON that escapes what is not): two scans in C.
    if "\0" in text:
        return False
    if text.isascii():
        return True
    try:
        # Fails on a lone surrogate only, and takes a third of a regex search's time.
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# What most parameters are besides text, skipped at the cost of one set look-up.
_NOT_TEXT = frozenset({int, float, bool, type(None), bytes, datetime, Decimal})


def _all_storable(values: Any) -> bool:
    for value in values:
        kind = type(value)
        if kind is str:
            if not _is_storable(value):
                return False
        elif kind in _NOT_TEXT:
            continue
        elif isinstance(value, (tuple, list)):
            # a DBAPI row of an executemany, or an array bound as a list (PostgreSQL).
            if not _all_storable(value):
                return False
        elif isinstance(value, dict) and not _all_storable(value.values()):
            return False
    return True


def _storable_values(value: Any) -> Any:
    if type(value) is str:
        return storable(value)
    if isinstance(value, dict):
        return {k: _storable_values(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map(_storable_values, value))
    if isinstance(value, list):
        return list(map(_storable_values, value))
    return value


def storable_parameters(parameters: Any) -> Any:
    """A statement's DBAPI parameters (a tuple or a dict, or a list of them for executemany)
    with every string in them, at any depth of lists, tuples and dicts, `storable`; the same
    object when none needed it, which is nearly always. JSON is bound as text that floom
    serialised, so a string inside a JSON value is one of these strings too. Strings of
    another type than `str` (a StrEnum's member) are floom's own words and left as they are."""
    if not parameters:
        return parameters
    values = parameters.values() if isinstance(parameters, dict) else parameters
    if _all_storable(values):
        return parameters
    return _storable_values(parameters)
