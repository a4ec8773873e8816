"""Idleness turned into a release: the last look at the engine, the stop committed, the GPU
released (by this replica alone, by the leader with the others fenced, or, when KEDA owns the
replicas, left to KEDA); what is left of a failed start or a lost workload; and a start nobody
waits for any more."""

from __future__ import annotations

import contextlib
import logging

from router.scale.accounting import Accounting
from router.scale.coordination import Others
from router.scale.deadline import idle_reached
from router.scale.fencing import Fencing
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.scale.transitions import Transitions

log = logging.getLogger("warmgate.lifecycle")


class Drain:
    def __init__(
        self,
        runtime: TargetRuntime,
        phases: Transitions,
        accounting: Accounting,
        fencing: Fencing,
        others: Others | None,
    ) -> None:
        self.rt = runtime
        self.phases = phases
        self.accounting = accounting
        self.fencing = fencing
        self.others = others

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    async def run(self, reason: str, *, keda: bool, idle_needed: float | None = None) -> None:
        """``idle_needed``: the idleness this release needs (the pool's ``yield_after`` when it
        makes room for another target); ``None``: ``idle_after``. A parked target is held from
        the start: it serves nothing meanwhile, and its engine has no queue to look at."""
        rt, phases = self.rt, self.phases
        before = rt.state
        parked = before.phase is Phase.PARKED
        phases.publish(
            rt.state.with_phase(Phase.DRAINING, self.now, reason=reason, stopping=parked)
        )
        # A last look at the engine's own queue (a render may have been queued since the last
        # poll). The workload is still up meanwhile: a request that arrives is served at once
        # and cancels the drain.
        endpoints = rt.state.endpoints
        if endpoints and not parked:
            await self.accounting.check_busy(endpoints[0])
        # Decide again, synchronously with setting ``stopping``: after this point new requests
        # are held for the next start, and streams (idle tabs) are closed.
        activity = rt.activity
        window = rt.spec.scaling.stream_activity_window
        idle_since = activity.idle_since(window)
        needed = rt.idle_after() if idle_needed is None else idle_needed
        if (
            activity.held > 0
            or idle_since is None
            or not idle_reached(self.now, idle_since, needed)
        ):
            phases.back_to(before, "drain cancelled")
            return
        phases.publish(rt.state.with_phase(Phase.DRAINING, self.now, reason=reason, stopping=True))
        if self.others is not None and not keda:
            await self.fencing.release(self.others, before, reason, idle_needed)
            return
        await phases.close_streams()
        if keda:  # the scaler now says inactive; KEDA's scale-down ends this (-> cold)
            if self.others is None or self.others.leading():  # counted once
                rt.metrics.idle_releases.labels(rt.name).inc()
            return
        await rt.backend.scale_down()
        rt.metrics.idle_releases.labels(rt.name).inc()
        phases.cold(reason)

    async def failed(self, exc: Exception) -> None:
        """The release could not be made: serving again once the workload is probed ready (the
        others, fenced, are let go)."""
        self.phases.starting(f"release failed: {exc}", stopping=False)
        if self.others is not None:
            with contextlib.suppress(Exception):
                await self.others.unfence_others(self.rt.name)

    async def reap(self, *, keda: bool) -> None:
        """After a failed start or a lost workload. With several replicas, never: the workload
        may serve another replica; a failed target whose workload runs on is released by
        idleness like a ready one (``decide``), fenced by the leader."""
        if keda:  # KEDA scales down once the scaler says inactive (and cooldown passed)
            return
        if self.others is not None:
            log.info("%s: left running: a stop is the leader's, once all are idle", self.rt.name)
            return
        await self.rt.backend.scale_down()

    async def abandon(self, reason: str, *, keda: bool) -> None:
        """A start this replica alone began and nobody waits for any more: stopped (a pod left
        Pending must not take a GPU later with nobody there); phase -> cold, and the next
        request starts it again. KEDA scales it down once the scaler says inactive."""
        rt = self.rt
        log.warning("%s: start abandoned (%s)", rt.name, reason)
        rt.activity.wanted_until = float("-inf")
        if not keda:
            await rt.backend.scale_down()
        self.phases.cold(f"start abandoned: {reason}")
