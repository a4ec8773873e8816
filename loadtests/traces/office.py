"""The office shape: a small lab sharing one render target on weekdays.

Each person of the lab (four by default) is modelled on their own, and the target sees them
together:

- **the day**: arrives between 08:00 and 09:30, leaves 8 to 9.5 hours later; about one day in
  twenty away (ill, travelling).
- **lunch**: the lab goes together around 12:00-12:30 for 40-65 minutes; one in five eats at
  another time (12:00-13:30, 20-45 minutes).
- **meetings**: the team meets on Mondays at 10:00 and on Thursdays at 14:00 for 30-60 minutes
  (nine in ten come); each person also has 0-2 meetings of their own a day (30-60 minutes, on
  the hour or the half hour).
- **coffee**: one or two breaks a day of 10-20 minutes, mid-morning and mid-afternoon.
- **work between them**: render sessions (15-75 minutes) alternate with other work (reading,
  code, mail: 10-60 minutes, no renders). In a session a person iterates: a render (4-20 s for
  an image, 60-150 s for a video one time in twenty), a look at it and a change (10 s to 2
  minutes, median 40 s), sometimes a few variations queued at once, now and then a longer
  pause of 2-8 minutes to rework the workflow; a page load when the session opens the UI.

Times are seconds from Monday 00:00 UTC; the lab's day is in UTC.
"""

from __future__ import annotations

import math
import random

DAY = 86400.0
HOUR = 3600.0
MINUTE = 60.0
Row = tuple[float, str, float]  # (seconds from the start, kind, work_seconds)
Busy = list[tuple[float, float]]
TEAM_MEETINGS = {0: 10.0, 3: 14.0}
"""Weekday -> the hour the whole lab meets."""


def _render(rng: random.Random) -> float:
    return rng.uniform(60, 150) if rng.random() < 0.05 else rng.uniform(4, 20)


def _think(rng: random.Random) -> float:
    """Seconds from seeing a render to sending the next one."""
    if rng.random() < 0.08:
        return rng.uniform(120, 480)  # reworking the workflow
    return min(120.0, max(10.0, rng.lognormvariate(math.log(40.0), 0.7)))


def _session(rng: random.Random, start: float, end: float) -> list[Row]:
    rows: list[Row] = []
    if rng.random() < 0.5:
        rows.append((start, "page", 0.3))
    t = start + rng.uniform(5, 60)
    while t < end:
        batch = rng.choice((2, 3, 4)) if rng.random() < 0.15 else 1
        work = [_render(rng) for _ in range(batch)]
        rows += [(t + i * 0.5, "render", w) for i, w in enumerate(work)]
        t += sum(work) + _think(rng)
    return rows


def _free(start: float, end: float, busy: Busy) -> list[tuple[float, float]]:
    """The parts of [start, end) outside every busy span."""
    spans = [(start, end)]
    for b0, b1 in sorted(busy):
        out = []
        for s0, s1 in spans:
            if b1 <= s0 or b0 >= s1:
                out.append((s0, s1))
                continue
            if s0 < b0:
                out.append((s0, b0))
            if b1 < s1:
                out.append((b1, s1))
        spans = out
    return spans


def _person(
    rng: random.Random, base: float, lunch: float, team: tuple[float, float] | None
) -> list[Row]:
    if rng.random() < 0.05:
        return []
    arrive = base + 8 * HOUR + rng.uniform(0, 90) * MINUTE
    leave = arrive + rng.uniform(8.0, 9.5) * HOUR
    busy: Busy = []
    if rng.random() < 0.8:
        at = lunch + rng.uniform(-5, 5) * MINUTE
        busy.append((at, at + rng.uniform(40, 65) * MINUTE))
    else:
        at = base + rng.uniform(12.0, 13.5) * HOUR
        busy.append((at, at + rng.uniform(20, 45) * MINUTE))
    if team is not None and rng.random() < 0.9:
        busy.append(team)
    for _ in range(rng.choices((0, 1, 2), (0.4, 0.4, 0.2))[0]):
        at = base + rng.randrange(18, 34) * 30 * MINUTE  # 09:00 .. 16:30
        busy.append((at, at + rng.uniform(30, 60) * MINUTE))
    for hour in (10.5, 15.5)[: rng.choice((1, 2))]:
        at = base + hour * HOUR + rng.uniform(-45, 45) * MINUTE
        busy.append((at, at + rng.uniform(10, 20) * MINUTE))
    rows: list[Row] = []
    rendering = rng.random() < 0.5
    for s0, s1 in _free(arrive, leave, busy):
        t = s0
        while t < s1:
            length = rng.uniform(15, 75) if rendering else rng.uniform(10, 60)
            end = min(s1, t + length * MINUTE)
            if rendering:
                rows += _session(rng, t, end)
            rendering = not rendering
            t = end
    return rows


def office(rng: random.Random, days: int, people: int = 4) -> list[Row]:
    rows: list[Row] = []
    for d in range(days):
        weekday = d % 7
        if weekday >= 5:
            continue  # the weekend
        base = d * DAY
        lunch = base + 12 * HOUR + rng.uniform(-10, 30) * MINUTE
        hour = TEAM_MEETINGS.get(weekday)
        team = None
        if hour is not None:
            team = (base + hour * HOUR, base + hour * HOUR + rng.uniform(30, 60) * MINUTE)
        for _ in range(people):
            rows += _person(rng, base, lunch, team)
    return rows
