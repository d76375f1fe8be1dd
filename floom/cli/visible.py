"""What the floom command shows of text that a worker or a caller controls (log lines,
outputs, errors, names, summaries): control characters in a visible form, so no byte of
theirs moves the operator's cursor, retitles the terminal, writes its clipboard or hides a
line. Every printer of the command goes through `visible` (console.py hooks it into both
consoles); `--raw` turns it off. Standard library only: the quick `floom run` path uses it.
"""

from __future__ import annotations

# As Python escapes (ESC -> `\x1b`), in ASCII so that they print on any terminal encoding:
# C0 controls but newline and tab, DEL, C1 controls (0x80-0x9f: CSI, OSC... on terminals
# that take the 8-bit forms), and the characters that reorder or break a line without
# showing (bidi overrides and isolates, line and paragraph separators).
_TABLE: dict[int, str] = {
    c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"
}
_TABLE.update(
    {c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)}
)

_raw = False


def show_raw(on: bool = True) -> None:
    """Print text as it is from now on (`--raw`): the operator asked for the bytes."""
    global _raw  # one switch for the whole command, set by its option
    _raw = on


def is_raw() -> bool:
    return _raw


def visible(text: str) -> str:
    """`text` with every control character in a visible form (unless `--raw` was given)."""
    return text if _raw else text.translate(_TABLE)
