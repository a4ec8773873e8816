"""Seeded request traces for ``warmgate simulate`` in three shapes, and a busy day for speed.

    python -m loadtests.traces.generate office [--days 5] [--people 4] [--seed 1] \
        [--target comfyui] > o.csv
    python -m loadtests.traces.generate evening [--days 5]
    python -m loadtests.traces.generate hobby   [--days 7]
    python -m loadtests.traces.generate busy    (one day of 10,000 requests)

- **office**: a lab of four on weekdays (loadtests/traces/office.py): each person from 08:00-09:30
  for 8-9.5 hours, render sessions (iterating: a render, a look, a change, seconds to minutes
  apart) between other work, coffee breaks, meetings of their own and the team's (30-60
  minutes), and lunch together around 12:00-12:30.
- **evening**: one creator after work, 19:00-23:30, in bursts of 15-40 minutes (renders every
  10-60 s, some of them videos of a minute or two) with 25-90 minutes between them.
- **hobby**: a sparse week: on about half the days one or two sessions of 10-40 minutes at a
  random hour, a render every 1-3 minutes.
- **busy**: a studio day, 10,000 requests around the clock (the replay's speed goal).

A render's ``work_seconds`` is its GPU time: 4-20 s for an image, 60-150 s for a video.
Times are seconds from Monday 00:00 UTC (``warmgate simulate --start`` moves them)."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable

from loadtests.traces.office import office
from router.simulate.trace import DEFAULT_START, Request, write

DAY = 86400.0
Row = tuple[float, str, float]  # (seconds from the start, kind, work_seconds)


def _render(rng: random.Random, video: float = 0.05) -> float:
    return rng.uniform(60, 150) if rng.random() < video else rng.uniform(4, 20)


def _session(
    rng: random.Random,
    start: float,
    end: float,
    every: tuple[float, float],
    pauses: float = 0.0,
    video: float = 0.05,
) -> list[Row]:
    """A page load at ``start``, then renders until ``end``; ``pauses``: chance per render of a
    3-8 minute pause before the next."""
    rows: list[Row] = [(start, "page", 0.3)]
    t = start + rng.uniform(5, 30)
    while t < end:
        rows.append((t, "render", _render(rng, video)))
        t += rng.uniform(*every)
        if rng.random() < pauses:
            t += rng.uniform(180, 480)
    return rows


def evening(rng: random.Random, days: int) -> list[Row]:
    rows: list[Row] = []
    for d in range(days):
        t = d * DAY + 19 * 3600 + rng.uniform(0, 3600)
        stop = d * DAY + 23.5 * 3600
        while t < stop:
            end = t + rng.uniform(900, 2400)
            rows += _session(rng, t, end, (10, 60), video=0.2)
            t = end + rng.uniform(1500, 5400)
    return rows


def hobby(rng: random.Random, days: int) -> list[Row]:
    rows: list[Row] = []
    for d in range(days):
        if rng.random() < 0.5:
            continue
        for _ in range(rng.choice((1, 1, 2))):
            t = d * DAY + rng.uniform(9, 22) * 3600
            rows += _session(rng, t, t + rng.uniform(600, 2400), (60, 180), video=0.1)
    return rows


def busy(rng: random.Random, days: int = 1, requests: int = 10_000) -> list[Row]:
    rows: list[Row] = []
    while len(rows) < requests:  # more in the day than at night
        t = rng.uniform(0, DAY * days)
        hour = t % DAY / 3600
        if rng.random() < (1.0 if 8 <= hour < 20 else 0.25):
            rows.append((t, "page" if rng.random() < 0.05 else "render", _render(rng, 0.0) / 4))
    return rows


SHAPES: dict[str, tuple[Callable[[random.Random, int], list[Row]], int]] = {
    "office": (office, 5),
    "evening": (evening, 5),
    "hobby": (hobby, 7),
    "busy": (busy, 1),
}
"""Shape -> (generator, default days)."""


def generate(
    shape: str,
    seed: int = 1,
    days: int | None = None,
    target: str = "comfyui",
    people: int | None = None,
) -> list[Request]:
    """``people``: the office's lab (default 4); the other shapes have one person."""
    make, default_days = SHAPES[shape]
    rng, days = random.Random(seed), days or default_days
    rows = sorted(office(rng, days, people) if shape == "office" and people else make(rng, days))
    return [
        Request(round(at, 3), target, None, kind, round(work, 3), None, False, i + 2)
        for i, (at, kind, work) in enumerate(rows)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--days", type=int, help="default: office 5, evening 5, hobby 7, busy 1")
    ap.add_argument("--people", type=int, help="office: the lab's size (default 4)")
    ap.add_argument("--target", default="comfyui")
    a = ap.parse_args(argv)
    requests = generate(a.shape, a.seed, a.days, a.target, a.people)
    write(requests, DEFAULT_START.timestamp(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
