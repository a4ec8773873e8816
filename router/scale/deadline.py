"""When a deadline on the loop clock counts as reached: the one rule the decisions and the
steps that carry them out share."""

from __future__ import annotations

SLACK = 0.001
"""Seconds: a deadline this close counts as reached (clocks are not infinitely fine, and a
timer that fires a hair early must not make the lifecycle spin)."""


def idle_reached(now: float, idle_since: float, needed: float) -> bool:
    """Whether idleness since ``idle_since`` has lasted ``needed`` seconds at the clock reading
    ``now`` (within :data:`SLACK`). The one test behind every release, park and yield: the
    decision and the lifecycle's last look before the stop make it alike, so at a reading right
    on the boundary (uvloop's clock reads whole milliseconds) the two never disagree."""
    return now + SLACK >= idle_since + needed
