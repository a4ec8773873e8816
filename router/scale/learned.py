"""What one target learned from its own starts and wakes, kept across restarts: the recent cold
starts (whole and per stage: the waiting page's ETA) and the recent wakes from parked, each read
back from the state store at start and written through it as it changes."""

from __future__ import annotations

import logging

from backends.base import StateStore
from router.scale.eta import ColdStarts
from router.scale.persist import Writer
from router.scale.state import Phase, TargetState
from router.scale.wakes import Wakes

log = logging.getLogger("warmgate.lifecycle")

LEARNED = "cold-start"
"""The key the learned cold-start figures are kept under (``router.scale.persist``)."""
WAKES = "wake"
"""The key the learned wakes from parked are kept under, beside the cold starts."""


class Learned:
    """The cold starts and the wakes of one target, and where they are kept."""

    def __init__(self, name: str, cold_starts: ColdStarts, wakes: Wakes) -> None:
        self.name = name
        self.cold_starts = cold_starts
        self.wakes = wakes
        self._kept: Writer | None = None
        self._kept_wakes: Writer | None = None

    def cold_start(self, seconds: float, stages: dict[str, float] | None = None) -> None:
        """Learn from one cold start (and its time per stage, where the backend told); kept."""
        self.cold_starts.record(seconds, stages)
        if self._kept is not None:
            self._kept.put(self.cold_starts.to_json())

    def wake(self, seconds: float) -> None:
        """Learn from one wake from parked; kept."""
        self.wakes.record(seconds)
        if self._kept_wakes is not None:
            self._kept_wakes.put(self.wakes.to_json())

    def eta(self, state: TargetState, now: float) -> float | None:
        """Expected seconds until ready at ``now`` in ``state``: the whole prediction when not
        starting; while starting, what is left of it (per stage where stages were learned);
        ``None`` while no GPU is free for it."""
        if state.phase is not Phase.STARTING:
            return self.cold_starts.predicted()
        in_stage = now - state.stage_since if state.stage is not None else 0.0
        return self.cold_starts.remaining(state.stage, in_stage, now - state.since)

    async def restore(self, store: StateStore) -> None:
        """Read back what was learned before a restart (a bad document: a warning, ignored),
        and write through ``store`` from now on."""
        document = await store.load(LEARNED)
        if document is not None:
            if self.cold_starts.restore(document):
                log.info(
                    "%s: %d cold starts remembered from %s (ETA %.1fs)",
                    self.name,
                    len(self.cold_starts.history),
                    store.where,
                    self.cold_starts.predicted(),
                )
            else:
                log.warning("%s: ignoring cold starts in %s: unknown form", self.name, store.where)
        self._kept = Writer(store, LEARNED)
        self._kept_wakes = await restore_wakes(self.name, self.wakes, store)

    async def close(self) -> None:
        """The last figures are written (bounded), nothing after."""
        for kept in (self._kept, self._kept_wakes):
            if kept is not None:
                await kept.close()


async def restore_wakes(name: str, wakes: Wakes, store: StateStore) -> Writer:
    """Read back the wakes learned before a restart (a bad document: a warning, relearned);
    the writer that keeps them from now on."""
    document = await store.load(WAKES)
    if document is not None:
        if wakes.load(document):
            log.info(
                "%s: %d wakes remembered from %s (a wake takes %.1fs)",
                name,
                len(wakes.history),
                store.where,
                wakes.predicted(),
            )
        else:
            log.warning("%s: ignoring wakes in %s: unknown form", name, store.where)
    return Writer(store, WAKES)
