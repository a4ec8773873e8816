"""The one door for outside text and numbers (backends/outside.py)."""

from __future__ import annotations

import math
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from backends.outside import ERROR_CHARS, count, number, one_line


def test_one_line_makes_outside_text_one_printable_bounded_line() -> None:
    assert one_line("  model not found:\r\n2026-01-01 INFO forged  ") == (
        "model not found: 2026-01-01 INFO forged"
    )
    assert one_line("a\x1b[31mred\x00b") == "a [31mred b"
    assert one_line("name \ud800.safetensors") == "name .safetensors"
    assert one_line("x" * 200_000) == "x" * (ERROR_CHARS - 1) + "…"
    assert one_line(42) == "42"
    assert one_line("\u202eevil") == "evil"


@given(st.text())
def test_one_line_of_any_text_encodes_and_stays_one_line(text: str) -> None:
    line = one_line(text)
    line.encode("utf-8")  # a lone surrogate would raise here
    assert len(line) <= ERROR_CHARS
    assert not any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in line)
    assert line == line.strip()


def test_numbers_from_outside_are_finite_in_bounds_and_never_bools() -> None:
    assert number(10**400) is None
    assert number(-(10**400)) is None
    assert number(math.inf) is None
    assert number(math.nan) is None
    assert number(True) is None
    assert number("3") is None
    assert number(3) == 3.0
    assert number(0.5, 0, 1) == 0.5
    assert number(2, 0, 1) is None
    assert count(7) == 7
    assert count(7.0) == 7
    assert count(7.5) is None
    assert count(-1) is None
    assert count(10**400) is None
    assert count(False) is None
