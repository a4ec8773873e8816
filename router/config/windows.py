"""``scaling.keep_warm`` windows: ``"Mon-Fri 08:30-18:00 Europe/Berlin"``.

A window is days (``Mon-Fri``, ``Sat,Sun``, ``Mon``, ``daily``; omitted: every day), a local time
span (``08:30-18:00``; an end before the start runs past midnight, ``22:00-02:00``) and an IANA
time zone (omitted: UTC). Pure: parsing, and the spans a window covers in wall-clock seconds."""

from __future__ import annotations

import datetime
import re
import zoneinfo
from dataclasses import dataclass

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
EXAMPLE = "Mon-Fri 08:30-18:00 Europe/Berlin"


@dataclass(frozen=True, slots=True)
class Window:
    days: frozenset[int]
    """Weekdays the window starts on, Monday 0."""
    start: datetime.time
    end: datetime.time
    zone: zoneinfo.ZoneInfo
    text: str

    def spans(self, first: datetime.date, last: datetime.date) -> list[tuple[float, float]]:
        """The (start, end) wall-clock seconds of each occurrence starting from ``first`` to
        ``last`` (local dates, both included)."""
        out: list[tuple[float, float]] = []
        day = first
        while day <= last:
            if day.weekday() in self.days:
                begin = datetime.datetime.combine(day, self.start, self.zone)
                end_day = day if self.end > self.start else day + datetime.timedelta(days=1)
                end = datetime.datetime.combine(end_day, self.end, self.zone)
                out.append((begin.timestamp(), end.timestamp()))
            day += datetime.timedelta(days=1)
        return out


def _days(text: str) -> frozenset[int]:
    if text.lower() in ("daily", "every", "*"):
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.lower().split(","):
        first, _, last = part.partition("-")
        if first[:3] not in DAYS or (last and last[:3] not in DAYS):
            raise ValueError(f"unknown day in {text!r} (expected e.g. Mon-Fri or Sat,Sun)")
        a = DAYS.index(first[:3])
        b = DAYS.index(last[:3]) if last else a
        i = a
        while True:
            days.add(i)
            if i == b:
                break
            i = (i + 1) % 7
    return frozenset(days)


def _time(hours: str, minutes: str, text: str) -> datetime.time:
    h, m = int(hours), int(minutes)
    if h == 24 and m == 0:
        return datetime.time.max
    if h > 23 or m > 59:
        raise ValueError(f"{text!r} is not a time of day")
    return datetime.time(h, m)


def parse_window(text: str) -> Window:
    """One window; ``ValueError`` naming what was expected."""
    if not isinstance(text, str):
        raise ValueError(f"expected a window such as {EXAMPLE!r}, got {text!r}")
    parts = text.split()
    span_at = next((i for i, part in enumerate(parts) if _SPAN.match(part)), None)
    if span_at is None or span_at > 1 or len(parts) > span_at + 2:
        raise ValueError(f"expected a window such as {EXAMPLE!r}, got {text!r}")
    days = _days(parts[0]) if span_at == 1 else frozenset(range(7))
    match = _SPAN.match(parts[span_at])
    assert match is not None
    start = _time(match.group(1), match.group(2), parts[span_at])
    end = _time(match.group(3), match.group(4), parts[span_at])
    if start == end:
        raise ValueError(f"{parts[span_at]!r} is empty (start and end are the same)")
    zone_name = parts[span_at + 1] if len(parts) > span_at + 1 else "UTC"
    try:
        zone = zoneinfo.ZoneInfo(zone_name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {zone_name!r} (expected e.g. Europe/Berlin)") from None
    return Window(days, start, end, zone, text)
