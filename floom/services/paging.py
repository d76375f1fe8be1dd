"""Pages of a list: the one check of the `cursor` and `limit` a caller passes, for every
list a surface pages through.

A cursor is what a list handed back as `next_cursor`: an id (prefix and hex, as
`floom.store.models.new_id` makes them), a worker name or a number. Lists compare it with
their rows, so a malformed one used as it is would read as "no more pages" (an empty page,
not an error) or as the first page; it is refused instead, naming `cursor`.
"""

from __future__ import annotations

import re

from floom.errors import InvalidRequest
from floom.manifest.schema import NAME_PATTERN

MAX_LIMIT = 500
_NAME = re.compile(NAME_PATTERN)
_HEX = re.compile(r"[0-9a-f]{1,40}")


def check_limit(limit: int, *, most: int = MAX_LIMIT) -> int:
    if not 1 <= limit <= most:
        raise InvalidRequest(
            f"limit must be between 1 and {most}",
            hint="use the cursor to page",
            details={"parameter": "limit"},
        )
    return limit


def id_cursor(cursor: str | None, *, prefix: str) -> str | None:
    """`cursor` as the id (`<prefix>_<hex>`) it must be, or None for the first page."""
    if not cursor:
        return None
    head, _, tail = cursor.partition("_")
    if head != prefix or not _HEX.fullmatch(tail):
        raise _refused(cursor, f"a {prefix}_... id")
    return cursor


def name_cursor(cursor: str | None) -> str | None:
    """`cursor` as the worker name it must be, or None for the first page."""
    if not cursor:
        return None
    if not _NAME.fullmatch(cursor):
        raise _refused(cursor, "a worker name")
    return cursor


def number_cursor(cursor: str | None, *, most: int) -> int | None:
    """`cursor` as the whole number from 0 to `most` it must be, or None for the first page.
    ASCII digits only (`str.isdigit` also takes "²", which `int` refuses)."""
    if not cursor:
        return None
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > len(str(most)):
        raise _refused(cursor, f"a whole number up to {most}")
    value = int(cursor)
    if value > most:
        raise _refused(cursor, f"a whole number up to {most}")
    return value


def _refused(cursor: str, shape: str) -> InvalidRequest:
    shown = cursor if len(cursor) <= 60 else cursor[:60] + "..."
    return InvalidRequest(
        f"cursor {shown!r} is not a cursor of this list (it takes {shape})",
        hint="pass the next_cursor of the previous page unchanged, or leave cursor out "
        "for the first page",
        details={"parameter": "cursor"},
    )
