"""One target's phase changes as its lifecycle makes them: each a new snapshot published whole
on the target's state cell, logged when the phase changes, and shown on the phase gauge."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from backends.base import Observation
from router.http.websocket import GOING_AWAY
from router.scale.scaling import backoff
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


class Transitions:
    def __init__(self, runtime: TargetRuntime) -> None:
        self.rt = runtime
        self.next_probe = 0.0
        """While starting: loop time of the next readiness probe."""
        self._phase_gauges = {
            phase: runtime.metrics.target_phase.labels(runtime.name, phase.value) for phase in Phase
        }
        runtime.cell.subscribe(self._on_state)
        self._on_state(runtime.state, runtime.state)

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def observation(self) -> Observation:
        return self.rt.backend.observe()

    def _on_state(self, old: TargetState, new: TargetState) -> None:
        if old.phase is not new.phase or old is new:
            for phase, gauge in self._phase_gauges.items():
                gauge.set(1 if phase is new.phase else 0)
        if old.phase is not new.phase:
            log.info(
                "%s: %s -> %s (%s)", self.rt.name, old.phase.value, new.phase.value, new.reason
            )

    def publish(self, state: TargetState) -> None:
        if state.phase is Phase.READY and not state.endpoints:
            # Never ready without an endpoint (a pod gone while its probe ran): every request
            # would fail. Starting, probed again once the backend reports one.
            log.warning("%s: ready without an endpoint; waiting for one", self.rt.name)
            if self.rt.state.phase is not Phase.STARTING:
                self.starting("no ready endpoint; waiting for one", endpoints=())
            return
        self.rt.cell.replace(state)

    def starting(self, reason: str, **changes: object) -> None:
        """To ``starting``, probed from now on (a start, one adopted, a pod to wait for)."""
        self.next_probe = self.now
        self.publish(self.rt.state.with_phase(Phase.STARTING, self.now, reason=reason, **changes))

    def cold(self, reason: str) -> None:
        self.publish(self.rt.state.with_phase(Phase.COLD, self.now, endpoints=(), reason=reason))

    def fail(self, reason: str) -> None:
        """A failed cold start: ``failed``, with the backoff before the next try."""
        rt = self.rt
        failures = rt.state.failures + 1
        wait = backoff(failures, rt.spec.scaling)
        log.warning("%s: cold start failed (%s); next try in %.0fs", rt.name, reason, wait)
        self.publish(
            rt.state.with_phase(
                Phase.FAILED,
                self.now,
                endpoints=(),
                reason=reason,
                failures=failures,
                retry_at=self.now + wait,
            )
        )

    def refresh(self) -> None:
        """Ready endpoints changed: the new set is published at once (a request never goes to
        a pod that is gone once its watch event arrived); none left: back to starting."""
        rt, endpoints = self.rt, self.observation.endpoints
        if endpoints:
            log.info("%s: ready endpoints now %s", rt.name, ", ".join(endpoints))
            self.publish(dataclasses.replace(rt.state, endpoints=endpoints))
        else:
            self.starting("no ready endpoint left; waiting for a replacement", endpoints=())

    def back_to(self, before: TargetState, reason: str) -> None:
        """A drain that does not happen: the phase it started from (ready, or failed with the
        workload left running), serving again."""
        rt = self.rt
        if before.phase is Phase.READY:
            self.publish(rt.state.with_phase(Phase.READY, self.now, reason=reason, stopping=False))
        else:
            self.publish(dataclasses.replace(before, reason=reason))

    async def close_streams(self) -> None:
        for close in list(self.rt.activity.streams.values()):
            with contextlib.suppress(Exception):
                await close(GOING_AWAY, "idle: the GPU is released")
