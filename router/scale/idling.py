"""One target's idle rule at run time: the fixed ``idle_after`` or the learned one
(:class:`router.scale.idle_policy.IdlePolicy`, fed with the gaps between bursts), and the
``keep_warm`` windows in which it is never released. The lifecycle reads it through
:meth:`IdleRule.idle_after` and :meth:`IdleRule.kept_warm`; the runtime feeds it through
:meth:`IdleRule.resumed`."""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable
from typing import Any

from router.config import Economics, Scaling
from router.config.windows import Window
from router.scale.idle_policy import IdlePolicy

_HORIZON_DAYS = 8
"""Windows are looked up this many days ahead (a weekly window always shows its next start)."""


def window_state(windows: tuple[Window, ...], wall: float) -> tuple[bool, float]:
    """Whether ``wall`` (epoch seconds) is inside a window, and the wall time of the next
    boundary (a window's start or end), ``inf`` when there is none. Pure."""
    spans: list[tuple[float, float]] = []
    for window in windows:
        day = datetime.datetime.fromtimestamp(wall, window.zone).date()
        first = day - datetime.timedelta(days=1)
        spans += window.spans(first, day + datetime.timedelta(days=_HORIZON_DAYS))
    inside = [end for start, end in spans if start <= wall < end]
    if inside:  # overlapping windows: inside until the last of the chain ends
        end = max(inside)
        while extended := [e for s, e in spans if s <= end < e]:
            end = max(extended)
        return True, end
    starts = [start for start, _ in spans if start > wall]
    return False, min(starts, default=math.inf)


class IdleRule:
    def __init__(
        self,
        scaling: Scaling,
        economics: Economics,
        loop: asyncio.AbstractEventLoop,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.scaling = scaling
        self.loop = loop
        self.wall = wall
        """Epoch seconds now (the replay's virtual day in ``warmgate simulate``)."""
        self.policy = (
            IdlePolicy(
                scaling.idle_bounds, economics.gpu_second_usd, economics.cold_wait_usd_per_second
            )
            if scaling.idle_auto
            else None
        )
        self.windows = scaling.windows
        self.dirty = False
        """A gap was learned since the last save."""
        self._window_until = -math.inf
        self._window_active = False

    def idle_after(self, cold_start: float) -> float:
        """Seconds idle before the release, now."""
        if self.policy is None:
            return self.scaling.idle_seconds
        return self.policy.idle_after(cold_start)

    def resumed(self, gap: float) -> None:
        """Activity began again after ``gap`` seconds idle (a request, a hold, a page)."""
        if self.policy is not None and self.policy.observe(gap):
            self.dirty = True

    def kept_warm(self) -> tuple[bool, float]:
        """Inside a ``keep_warm`` window now, and the loop time at which that changes."""
        if not self.windows:
            return False, math.inf
        wall, now = self.wall(), self.loop.time()
        if wall >= self._window_until:
            self._window_active, self._window_until = window_state(self.windows, wall)
        return self._window_active, now + (self._window_until - wall)

    def describe(self, cold_start: float) -> dict[str, Any]:
        """What ``/targets`` and the dashboard show of it."""
        out: dict[str, Any] = {
            "idle_after": round(self.idle_after(cold_start), 3),
            "idle_auto": self.policy is not None,
        }
        if self.policy is not None:
            out["learned"] = self.policy.describe(cold_start)
        if self.windows:
            active, until = self.kept_warm()
            out["keep_warm"] = {
                "windows": [w.text for w in self.windows],
                "active": active,
                "changes_in": None if math.isinf(until) else round(until - self.loop.time(), 3),
            }
        return out
