"""What the floom command shows of text that a worker or a caller controls (log lines,
outputs, errors, names, summaries): control characters in a visible form, so no byte of
theirs moves the operator's cursor, retitles the terminal, writes its clipboard or hides a
line. Every printer of the command goes through `visible` (console.py hooks it into both
consoles); `--raw` turns it off. Standard library only: the quick `floom run` path uses it.
"""

from __future__ import annotations

from floom.invisible import CONTROLS, UNSHOWN, escapes

# As Python escapes (ESC -> `\x1b`), in ASCII so that they print on any terminal encoding:
# C0 controls but newline and tab, DEL, C1 controls (0x80-0x9f: CSI, OSC... on terminals
# that take the 8-bit forms), and the characters that reorder, break or hide text without
# showing (floom/invisible.py).
_TABLE: dict[int, str] = escapes([*(c for c in CONTROLS if chr(c) not in "\n\t"), *UNSHOWN])

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
