"""What one target learned, in one store: the recent cold starts (whole and per stage: the
waiting page's ETA), the recent wakes from parked, and the gaps between bursts of use
(``idle_after: auto``, :mod:`router.scale.idling`). Each is read back from the state store at
start and written through it as it changes; the lifecycle is their one writer."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from backends.documents import StateStore
from router.config import Economics, Scaling
from router.scale.eta import ColdStarts
from router.scale.idle_policy import Windows
from router.scale.idling import IdleRule
from router.scale.persist import Writer, read_back
from router.scale.state import Phase, TargetState
from router.scale.wakes import Wakes

log = logging.getLogger("warmgate.lifecycle")

LEARNED = "cold-start"
"""The key the learned cold-start figures are kept under (``router.scale.persist``)."""
WAKES = "wake"
"""The key the learned wakes from parked are kept under, beside the cold starts."""


class Learned:
    """The cold starts, the wakes and the idle gaps of one target, and where they are kept."""

    def __init__(
        self,
        name: str,
        scaling: Scaling,
        economics: Economics,
        loop: asyncio.AbstractEventLoop,
        *,
        parks: bool,
        assumed_cold_start: float,
    ) -> None:
        self.name = name
        self.scaling = scaling
        self.loop = loop
        expected = scaling.expected_cold_start
        self.cold_starts = ColdStarts(assumed_cold_start if expected is None else expected)
        """What the recent cold starts took (whole and per stage): the ETA of the next one."""
        expected_wake = scaling.expected_wake
        self.wakes = Wakes() if expected_wake is None else Wakes(expected_wake)
        """The recent wakes from parked: what the next one is expected to take."""
        self.idling = IdleRule(scaling, economics, loop, parks=parks)
        """``idle_after`` and ``park_after`` (fixed or learned) and the ``keep_warm`` windows."""
        self.store: StateStore | None = None
        """Where it survives a restart (set by the wiring; ``None``: forgotten)."""
        self._kept: Writer | None = None
        self._kept_wakes: Writer | None = None

    def cold_start(self, seconds: float, stages: dict[str, float] | None = None) -> None:
        """Learn from one cold start (and its time per stage, where the backend told); kept.
        What it cost in waiting is weighed by ``idle_after: auto``."""
        self.cold_starts.record(seconds, stages)
        if self._kept is not None:
            self._kept.put(self.cold_starts.to_json())
        self.idling.waits.start(seconds, self.loop.time(), self.scaling.cold_start_timeout)

    def wake(self, seconds: float) -> None:
        """Learn from one wake from parked; kept."""
        self.wakes.record(seconds)
        if self._kept_wakes is not None:
            self._kept_wakes.put(self.wakes.to_json())
        self.idling.waits.start(seconds, self.loop.time(), self.scaling.cold_start_timeout)

    def predicted_cold_start(self) -> float:
        """Expected seconds from scale-up to ready: learned from the recent cold starts, else
        ``scaling.expected_cold_start`` (or ``policy.assumed_cold_start``): one figure for the
        waiting page and the policy alike."""
        return self.cold_starts.predicted()

    def windows(self) -> Windows:
        """``idle_after`` and ``park_after`` (0: never parked) in force now (``auto``: as
        learned so far)."""
        return self.idling.in_force(self.cold_starts.predicted(), self.wakes.predicted())

    def describe_idle(self) -> dict[str, Any]:
        """The windows in force and what they were learned from (``/targets``, dashboard)."""
        return self.idling.describe(self.cold_starts.predicted(), self.wakes.predicted())

    def eta(self, state: TargetState) -> float | None:
        """Expected seconds until ready, now, in ``state``: the whole prediction when not
        starting; while starting, what is left of it (per stage where stages were learned);
        ``None`` while no GPU is free for it."""
        if state.phase is not Phase.STARTING:
            return self.cold_starts.predicted()
        now = self.loop.time()
        in_stage = now - state.stage_since if state.stage is not None else 0.0
        return self.cold_starts.remaining(state.stage, in_stage, now - state.since)

    async def restore(self) -> None:
        """Read back what was learned before a restart (a bad document: a warning, ignored),
        and write through the store from now on."""
        store = self.store
        if store is None:
            return
        if await read_back(store, LEARNED, self.cold_starts.restore, "cold starts", self.name):
            log.info(
                "%s: %d cold starts remembered from %s (ETA %.1fs)",
                self.name,
                len(self.cold_starts.history),
                store.where,
                self.cold_starts.predicted(),
            )
        self._kept = Writer(store, LEARNED)
        self._kept_wakes = await restore_wakes(self.name, self.wakes, store)
        await self.idling.restore(store)

    async def close(self) -> None:
        """The last figures are written (bounded), nothing after."""
        for kept in (self._kept, self._kept_wakes):
            if kept is not None:
                await kept.close()
        await self.idling.close()


async def restore_wakes(name: str, wakes: Wakes, store: StateStore) -> Writer:
    """Read back the wakes learned before a restart (a bad document: a warning, relearned);
    the writer that keeps them from now on."""
    if await read_back(store, WAKES, wakes.load, "wakes", name):
        log.info(
            "%s: %d wakes remembered from %s (a wake takes %.1fs)",
            name,
            len(wakes.history),
            store.where,
            wakes.predicted(),
        )
    return Writer(store, WAKES)
