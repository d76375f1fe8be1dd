"""Text cut to a bound for showing or keeping, with a marker saying it was cut.

Standard library only: the quick command-line paths import it.
"""

from __future__ import annotations

MARKER = "..."


def cut(text: str, most: int, *, marker: str = MARKER) -> str:
    """`text` when it has at most `most` characters; else its beginning and `marker`, `most`
    characters in all."""
    if len(text) <= most:
        return text
    return text[: max(most - len(marker), 0)] + marker
