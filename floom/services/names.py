"""The one check of a name a caller writes as free text (a key's name, an agent's label and
tool family): names are stored, listed, put in headers and printed, so a control character
in one is refused, never stored in another form; so is a character that reorders or
hides text (a bidi override, a zero-width space: floom/invisible.py), with which one name
looks like another.

The store writes a NUL as U+FFFD (PostgreSQL holds no NUL in text; floom/store/db.py), so a
NUL kept in a name would be answered as sent and stored as something else; a newline or a
terminal escape would make one name look like another in a listing. Names checked by a
pattern (workers, roles, secrets, channels, rules) refuse them already.
"""

from __future__ import annotations

from floom.errors import InvalidRequest
from floom.invisible import NOT_IN_NAMES, describe


def check_text_name(value: str, *, field: str, most: int, kept_as: str = "a name") -> str:
    """`value` if it can be a name: at most `most` characters, no control or invisible
    character; otherwise InvalidRequest naming `field`. `kept_as` says what the refusal
    calls it: a name, or other one-line text held to the same rule (a job's summary)."""
    if len(value) > most:
        raise InvalidRequest(
            f"{field} is longer than {most} characters",
            hint=f"give a {field} of at most {most} characters",
            details={"field": field},
        )
    found = NOT_IN_NAMES.search(value)
    if found is not None:
        code = ord(found.group())
        raise InvalidRequest(
            f"{field} holds {describe(code)} (U+{code:04X}), which {kept_as} cannot hold",
            hint=f"give a {field} of printable characters only (no NUL, newline, tab, escape, "
            "bidi control or zero-width character)",
            details={"field": field},
        )
    return value
