"""The day of each target in the operator's view, from its timeline
(:mod:`router.scale.timeline`): the strip of phases and its marks (``/status``'s
``timeline``), today's GPU-hours by what the GPU did, and the waits for cold starts and wakes
that requests met today. Times are wall-clock epoch seconds; today is since midnight UTC."""

from __future__ import annotations

import datetime
from typing import Any

from router.scale.targets import TargetRuntime
from router.scale.timeline import WINDOW

Json = dict[str, Any]

HOURS = ("busy", "idle", "parked", "starting")
"""What a GPU-hour of a target went to (draining counts as idle: the GPU held, no work)."""


def midnight(epoch: float) -> float:
    day = datetime.datetime.fromtimestamp(epoch, datetime.UTC).date()
    return datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC).timestamp()


def timeline(runtime: TargetRuntime, now: float) -> Json:
    """The strip of the last day (its first segment may begin before the window) and its marks:
    ``{window, segments: [[at, label]], marks: [{at, kind, held, seconds}]}``."""
    return {"window": WINDOW, **runtime.timeline.to_json(now - WINDOW)}


def gpu_hours_today(runtime: TargetRuntime, now: float) -> Json:
    """Hours since midnight UTC the target held its GPU, by what for (``HOURS``)."""
    seconds = runtime.timeline.seconds(midnight(now), now)
    seconds["idle"] = seconds.get("idle", 0.0) + seconds.get("draining", 0.0)
    return {key: round(seconds.get(key, 0.0) / 3600, 4) for key in HOURS}


def waits_today(runtime: TargetRuntime, now: float) -> Json:
    """Seconds of each wait requests met today, by what ended it: a ``cold start`` or a
    ``wake`` that ended ready, or a start or wake that ``failed``."""
    return {
        kind: [round(w, 1) for w in waits]
        for kind, waits in runtime.timeline.waits_by_kind(midnight(now)).items()
    }
