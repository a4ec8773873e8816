"""One target's idle rule at run time: the fixed ``idle_after`` and ``park_after`` or the learned
ones (:class:`router.scale.idle_policy.IdlePolicy`, fed with the gaps between bursts), and the
``keep_warm`` windows in which it is never released. The lifecycle reads it through
:meth:`IdleRule.in_force` and :meth:`IdleRule.kept_warm`; the runtime feeds it through
:meth:`IdleRule.resumed`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from router.config import Economics, Scaling
from router.config.windows import Window
from router.scale.idle_policy import Ask, IdlePolicy, Waits, Windows
from router.scale.persist import read_back

log = logging.getLogger("warmgate.state")

IDLE_KEY = "idle"
"""The key the learned histogram is kept under, beside the learned cold starts."""
_CLOSE_TIMEOUT = 5.0


class Store(Protocol):
    """Where the histogram outlives a restart (``backends.documents.StateStore`` is one: a
    state file on one machine, the Deployment's annotation in a cluster)."""

    @property
    def where(self) -> str: ...

    async def load(self, key: str) -> dict[str, Any] | None: ...

    def name_of(self, key: str) -> str: ...

    async def save(self, key: str, document: Mapping[str, Any]) -> None: ...


_HORIZON_DAYS = 8
"""Windows are looked up this many days ahead (a weekly window always shows its next start)."""


def window_state(windows: tuple[Window, ...], wall: float, lead: float = 0.0) -> tuple[bool, float]:
    """Whether ``wall`` (epoch seconds) is inside a window, and the wall time of the next
    boundary (a window's start or end), ``inf`` when there is none. ``lead``: seconds each
    window begins early (a start's length: warm when the window opens). Pure."""
    spans: list[tuple[float, float]] = []
    for window in windows:
        day = datetime.datetime.fromtimestamp(wall, window.zone).date()
        first = day - datetime.timedelta(days=1)
        last = day + datetime.timedelta(days=_HORIZON_DAYS)
        spans += [(start - lead, end) for start, end in window.spans(first, last)]
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
        *,
        parks: bool = False,
    ) -> None:
        """``parks``: the target's engine has a park action (``park_after`` then applies)."""
        self.scaling = scaling
        self.loop = loop
        self.wall = wall
        """Epoch seconds now (the replay's virtual day in ``warmgate simulate``)."""
        self.parks = parks and (scaling.park_auto or scaling.park_seconds > 0)
        """The parked tier applies: an engine that parks, and ``park_after`` set."""
        self.policy = (
            IdlePolicy(
                scaling.idle_bounds,
                economics.gpu_second_usd,
                economics.cold_wait_usd_per_second,
                economics.parked_second_usd,
            )
            if scaling.idle_auto or (self.parks and scaling.park_auto)
            else None
        )
        self.waits = Waits()
        """How many people wait through a start or a wake: what one costs in waiting."""
        self.windows = scaling.windows
        self.dirty = False
        """A gap was learned since the last save."""
        self._window_until = -math.inf
        self._window_active = False
        self._window_lead = 0.0
        self._learned_to = loop.time()
        """The end of the last burst whose following gap was learned (at first, the start)."""
        self._store: Store | None = None
        self._saving: asyncio.Task[None] | None = None

    def in_force(self, cold_start: float, wake: float = 2.0) -> Windows:
        """``idle_after`` and ``park_after`` (0: never parked) in force, for a target whose
        cold start takes ``cold_start`` seconds and a wake ``wake``."""
        if self.policy is None:
            park = self.scaling.park_seconds if self.parks else 0.0
            return Windows(self.scaling.idle_seconds, park)
        return self.policy.windows(self._ask(cold_start, wake))

    def _ask(self, cold_start: float, wake: float) -> Ask:
        scaling = self.scaling
        return Ask(
            cold_start,
            wake,
            parks=self.parks,
            idle_after=None if scaling.idle_auto else scaling.idle_seconds,
            park_after=None if scaling.park_auto else scaling.park_seconds,
            waiters=self.waits.waiters,
        )

    def idle_after(self, cold_start: float, wake: float = 2.0) -> float:
        """Seconds idle before the release."""
        return self.in_force(cold_start, wake).idle_after

    def resumed_at(self, idle_since: float | None, now: float) -> None:
        """Activity began at ``now`` with none before it, idle since ``idle_since``: the gap
        since the last burst ended is learned, once (a page load, then its render held, then in
        flight all end the same gap), and not the first use's (the time since warmgate started
        is no gap between bursts). A request while the burst goes on (the engine's queue busy,
        a stream's frames within ``stream_activity_window``: idle only from a time still to
        come) ends no gap, and leaves the one that follows that time to be learned."""
        if idle_since is None or idle_since >= now or idle_since <= self._learned_to:
            return
        self._learned_to = idle_since
        self.resumed(now - idle_since)

    def forget_gap(self, idle_since: float | None) -> None:
        """The gap that began at ``idle_since`` is not learned when activity resumes: an
        operator's release ended it, not the people who use the target."""
        if idle_since is not None:
            self._learned_to = max(self._learned_to, idle_since)

    def resumed(self, gap: float) -> None:
        """Activity began again after ``gap`` seconds idle (a request, a hold, a page)."""
        if self.policy is not None and self.policy.observe(gap):
            self.dirty = True
            self._save_soon()

    # -- kept across restarts ---------------------------------------------------------------

    async def restore(self, store: Store) -> None:
        """Read back the histogram learned before a restart (unreadable: a warning, relearned)
        and keep it in ``store`` from now on, written through as it changes."""
        if self.policy is None:
            return
        await read_back(store, IDLE_KEY, self.policy.load_json, "the idle histogram")
        self._store = store

    def _save_soon(self) -> None:
        """One write at a time, of the latest histogram; never blocks, never raises."""
        if self._store is None or (self._saving is not None and not self._saving.done()):
            return
        self._saving = self.loop.create_task(self._save(), name="idle-histogram")

    async def _save(self) -> None:
        while self._store is not None and self.policy is not None and self.dirty:
            self.dirty = False
            try:
                await self._store.save(IDLE_KEY, self.policy.to_json())
            except Exception as exc:  # a store away costs a relearn, never a start
                log.warning("idle histogram not kept in %s: %s", self._store.where, exc)
                return

    async def close(self) -> None:
        """The last histogram is written (bounded), nothing after."""
        if self._store is None:
            return
        self._save_soon()
        if self._saving is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._saving), _CLOSE_TIMEOUT)
        self._store = None

    def kept_warm(self, lead: float = 0.0) -> tuple[bool, float]:
        """Inside a ``keep_warm`` window now, and the loop time at which that changes. Each
        window begins ``lead`` seconds early (the cold start predicted: the target is warm when
        the window opens, not starting)."""
        if not self.windows:
            return False, math.inf
        wall, now = self.wall(), self.loop.time()
        if wall >= self._window_until or lead != self._window_lead:
            self._window_lead = lead
            self._window_active, self._window_until = window_state(self.windows, wall, lead)
        return self._window_active, now + (self._window_until - wall)

    def describe(self, cold_start: float, wake: float = 2.0) -> dict[str, Any]:
        """What ``/targets`` and the dashboard show of it."""
        windows = self.in_force(cold_start, wake)
        out: dict[str, Any] = {
            "idle_after": round(windows.idle_after, 3),
            "idle_auto": self.scaling.idle_auto,
        }
        if self.parks:
            out["park_after"] = round(windows.park_after, 3)
            out["park_auto"] = self.scaling.park_auto
        if self.policy is not None:
            ask = self._ask(cold_start, wake)
            out["learned"] = self.policy.describe(ask)
        if self.windows:
            active, until = self.kept_warm(cold_start)
            out["keep_warm"] = {
                "windows": [w.text for w in self.windows],
                "active": active,
                "changes_in": None if math.isinf(until) else round(until - self.loop.time(), 3),
            }
        return out
