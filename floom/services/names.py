"""The one check of a name a caller writes as free text (a key's name, an agent's label and
tool family): names are stored, listed, put in headers and printed, so a control character
in one is refused, never stored in another form.

The store writes a NUL as U+FFFD (PostgreSQL holds no NUL in text; floom/store/db.py), so a
NUL kept in a name would be answered as sent and stored as something else; a newline or a
terminal escape would make one name look like another in a listing. Names checked by a
pattern (workers, roles, secrets, channels, rules) refuse them already.
"""

from __future__ import annotations

import re

from floom.errors import InvalidRequest

# C0 (NUL, tab, newline, escape...), DEL, C1, and the two Unicode line separators.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_text_name(value: str, *, field: str, most: int) -> str:
    """`value` if it can be a name: at most `most` characters, no control character;
    otherwise InvalidRequest naming `field`."""
    if len(value) > most:
        raise InvalidRequest(
            f"{field} is longer than {most} characters",
            hint=f"give a {field} of at most {most} characters",
            details={"field": field},
        )
    found = CONTROL.search(value)
    if found is not None:
        raise InvalidRequest(
            f"{field} holds a control character (U+{ord(found.group()):04X}), which a name "
            "cannot hold",
            hint=f"give a {field} of printable characters only (no NUL, newline, tab or escape)",
            details={"field": field},
        )
    return value
