"""The generated traces (loadtests/traces): seeded, and shaped as their docstrings say."""

from __future__ import annotations

import itertools

from loadtests.traces.generate import generate

DAY = 86400.0


def test_the_office_is_a_lab_on_weekdays_working_hours() -> None:
    week = generate("office", seed=3, days=7)
    assert week == generate("office", seed=3, days=7) != generate("office", seed=4, days=7)
    days = {int(r.at // DAY) for r in week}
    assert days == {0, 1, 2, 3, 4}  # Monday to Friday; the weekend is quiet
    assert all(8 * 3600 <= r.at % DAY < 20 * 3600 for r in week)
    assert {r.kind for r in week} == {"page", "render"}
    assert all(4 <= (r.work_seconds or 0) <= 150 for r in week if r.kind == "render")
    bigger = generate("office", seed=3, days=7, people=8)
    assert len(bigger) > 1.5 * len(week)


def test_the_office_pauses_for_lunch_and_the_evening() -> None:
    week = generate("office", seed=1, days=5)
    for day in range(5):
        times = sorted(r.at % DAY for r in week if int(r.at // DAY) == day)
        gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
        longest, began = max(gaps)
        assert longest >= 20 * 60  # lunch or a meeting: nobody renders for a while
        assert 9 * 3600 <= began <= 15 * 3600
        assert times[-1] >= 16 * 3600  # people work into the afternoon


def test_the_other_shapes() -> None:
    evening = generate("evening", seed=1)
    assert all(19 * 3600 <= r.at % DAY < 24 * 3600 for r in evening)
    assert len(generate("busy", seed=1)) == 10_000
    hobby = generate("hobby", seed=1)
    assert 0 < len(hobby) < 300
