"""floom.cut: text cut to a bound says it was cut, and is never longer than the bound."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from floom.cut import MARKER, cut


def test_text_within_the_bound_is_kept_whole() -> None:
    assert cut("", 5) == ""
    assert cut("abcde", 5) == "abcde"


def test_longer_text_keeps_its_beginning_and_ends_with_the_marker_at_the_bound() -> None:
    assert cut("abcdef", 5) == "ab..."
    assert cut("a" * 300, 120) == "a" * 117 + "..."


def test_the_marker_can_be_chosen() -> None:
    assert cut("abcdef", 5, marker="…") == "abcd…"


@given(st.text(), st.integers(min_value=len(MARKER), max_value=200))
def test_a_cut_is_the_text_or_its_beginning_and_the_marker_never_past_the_bound(
    text: str, most: int
) -> None:
    shown = cut(text, most)
    assert len(shown) <= most
    if len(text) <= most:
        assert shown == text
    else:
        assert shown.endswith(MARKER)
        assert text.startswith(shown[: -len(MARKER)])
