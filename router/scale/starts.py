"""The stages of one target's starts, as its lifecycle sees them go by: each stage's time is
observed on ``warmgate_cold_start_stage_seconds{target,stage}`` when it ends, and a start that
ends ready hands its times per stage to what is learned (:mod:`router.scale.eta`).

It follows the target's state cell: a start begins when the phase turns ``starting``, a stage
ends when the published stage changes, the start ends when the phase leaves ``starting``.
"""

from __future__ import annotations

import logging

from backends.base import Stage
from router.scale.eta import UNKNOWN
from router.scale.machine import Event, Machine
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


class StageClock:
    def __init__(self, runtime: TargetRuntime, machine: Machine) -> None:
        self.rt = runtime
        self.machine = machine
        self.times: dict[str, float] = {}
        """Seconds per stage of the start under way (or the last one)."""
        self._histogram = runtime.metrics.cold_start_stage_seconds
        runtime.cell.subscribe(self._on_state)

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    def _on_state(self, old: TargetState, new: TargetState) -> None:
        starting = new.phase is Phase.STARTING
        if starting and old.phase is not Phase.STARTING:
            self.times = {}
        elif (
            old.phase is Phase.STARTING
            and old.stage is not None
            and (not starting or new.stage != old.stage)
        ):
            self._stage_ended(old.stage, self.now - old.stage_since)
        if starting and new.stage != old.stage and new.stage is not None:
            message = f": {new.stage_message}" if new.stage_message else ""
            log.info("%s: start stage %s%s", self.rt.name, new.stage, message)

    def _stage_ended(self, stage: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.times[stage] = self.times.get(stage, 0.0) + seconds
        self._histogram.labels(self.rt.name, stage).observe(seconds)

    def so_far(self) -> dict[str, float]:
        """Seconds per stage of the start under way, its current stage counted up to now."""
        times = dict(self.times)
        state = self.rt.state
        if state.phase is Phase.STARTING and state.stage is not None:
            seconds = max(0.0, self.now - state.stage_since)
            times[state.stage] = times.get(state.stage, 0.0) + seconds
        return times

    def waited_for_gpu(self) -> float:
        """Seconds of the start under way no one could foresee (``unschedulable``)."""
        return sum(t for stage, t in self.so_far().items() if stage in UNKNOWN)

    def publish(self, stage: Stage | None, message: str, progress: float | None) -> None:
        """The state with the stage as it is now (``router.scale.scaling.stage_now``); the
        stage's clock restarts when the stage changes."""
        self.machine.apply(Event.STAGE, stage=stage, stage_message=message, progress=progress)

    def progressed(self, progress: float | None, message: str = "") -> None:
        """The engine's readiness answer carried its load progress (``None``: none) or its
        own words on where its start is (``""``: none)."""
        state = self.rt.state
        if state.phase is not Phase.STARTING:
            return
        loading = state.stage in (None, "loading")
        if progress is None or not loading:
            progress = state.progress
        message = message or state.stage_message
        if (progress, message) != (state.progress, state.stage_message):
            self.machine.apply(Event.STAGE, progress=progress, stage_message=message)
