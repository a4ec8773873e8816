"""The one door for outside text and numbers (backends/outside.py)."""

from __future__ import annotations

import math
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from backends.base import Observation, Rollout, StartFailed
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


def test_what_a_backend_reports_enters_through_the_door() -> None:
    """Observation, Rollout and StartFailed: what a backend or an engine reports reaches the
    router as one bounded line, a progress only within 0..1."""
    hostile = "image:v1\r\n2026 ERROR forged\x1b[2J\x00\ud800" + "x" * 10_000
    seen = Observation(
        failure=hostile,
        degraded=hostile,
        stage_message=hostile,
        failure_reason=hostile,
        progress=10**400,
    )
    for text in (seen.failure, seen.degraded, seen.stage_message, seen.failure_reason):
        assert text is not None and text == one_line(text) and len(text) <= ERROR_CHARS
    assert seen.progress is None
    assert Observation(progress=0.5).progress == 0.5
    rollout = Rollout(hostile, hostile, 1, 1, 1, True)
    assert rollout.declared == one_line(hostile) and rollout.running == one_line(hostile)
    assert str(StartFailed(hostile)) == one_line(hostile)
