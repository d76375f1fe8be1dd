"""The characters that change how text shows without showing themselves, in one place, for
every surface that shows what a worker or a caller wrote (the floom command, MCP replies, the
web UI) and every check of a name they choose (keys, labels, artifacts).

- CONTROLS: C0 (NUL, newline, escape...), DEL and C1 (CSI, OSC... in their 8-bit forms).
- SEPARATORS: the Unicode line and paragraph separators, which break a line.
- REORDERING: bidi overrides, embeddings and isolates, and the bidi marks (ALM, LRM, RLM):
  "invoice_\u202efdp.exe" shows as "invoice_exe.pdf".
- ZERO_WIDTH: marks that show as nothing (zero-width space, word joiner, invisible
  operators, BOM, Mongolian vowel separator): "deploy" and "dep\u200bloy" look the same.
  The zero-width joiner and non-joiner are left out: scripts and emoji need them.

Standard library only: the quick `floom run` path imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

CONTROLS: Final = frozenset((*range(0x20), *range(0x7F, 0xA0)))
SEPARATORS: Final = frozenset((0x2028, 0x2029))
REORDERING: Final = frozenset(
    (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x061C, 0x200E, 0x200F)
)
ZERO_WIDTH: Final = frozenset((0x200B, *range(0x2060, 0x2065), 0xFEFF, 0x180E))
UNSHOWN: Final = SEPARATORS | REORDERING | ZERO_WIDTH
"""What no surface shows as it is, beyond the controls."""


def escapes(codes: Iterable[int]) -> dict[int, str]:
    """A str.translate table showing each of `codes` as a Python escape in ASCII
    (`\\x1b`, `\\u202e`)."""
    return {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in codes}


def pattern(codes: Iterable[int]) -> re.Pattern[str]:
    """A pattern matching any one of `codes`."""
    return re.compile("[" + "".join(re.escape(chr(c)) for c in sorted(codes)) + "]")


NOT_IN_NAMES: Final = pattern(CONTROLS | UNSHOWN)
"""What a name a worker or a caller chooses cannot hold."""


_SHOWN_ESCAPED: Final = escapes(CONTROLS | UNSHOWN)


def shown(text: str) -> str:
    """`text` (a name a worker chose) as floom's own words show it: a byte that is not UTF-8
    (read by Python as a lone surrogate, which no store or answer can hold) as \\xNN, and
    what does not show as itself escaped, so a newline or a terminal escape neither breaks a
    record nor shapes a log."""
    if text.isascii() and text.isprintable():
        return text
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.translate(_SHOWN_ESCAPED)


def describe(code: int) -> str:
    """What kind of character `code` is, in a refusal's words."""
    if code in CONTROLS or code in SEPARATORS:
        return "a control character"
    if code in REORDERING:
        return "a bidi override, isolate or mark, which shows the text reordered"
    return "a zero-width character, which shows as nothing"
