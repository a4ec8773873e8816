"""The parked tier, one target's side of it: parking (the engine drops its weights from the GPU,
its process or pod stays), waking (it loads them again, probed like a start), and stopping
instead when either fails (docs/pools.md).

A park is decided like a release (:func:`router.scale.scaling.decide`: idle for ``park_after``,
or chosen to make room in a GPU pool) and re-checked here right before the engine is asked:
never with a request held or in flight, a busy engine queue or a stream carrying traffic. With
several replicas only the leader parks, with the others fenced first, as it releases."""

from __future__ import annotations

import dataclasses
import logging

from backends.base import ParkError, parking
from router.scale.accounting import Accounting
from router.scale.coordination import Others
from router.scale.deadline import idle_reached
from router.scale.fencing import Fencing
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.scale.transitions import Transitions

log = logging.getLogger("warmgate.lifecycle")


class Parking:
    def __init__(
        self,
        runtime: TargetRuntime,
        phases: Transitions,
        accounting: Accounting,
        fencing: Fencing,
        others: Others | None,
        *,
        keda: bool,
    ) -> None:
        self.rt = runtime
        self.phases = phases
        self.accounting = accounting
        self.fencing = fencing
        self.others = others
        self.keda = keda

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    def _idle_for(self, needed: float) -> bool:
        """Nothing held, in flight, streaming or queued in the engine, for ``needed`` seconds."""
        rt = self.rt
        activity = rt.activity
        idle_since = activity.idle_since(rt.spec.scaling.stream_activity_window)
        if activity.held > 0 or idle_since is None:
            return False
        return idle_reached(self.now, idle_since, needed)

    async def park(self, reason: str, idle_needed: float, *, displaced: bool = False) -> None:
        rt, phases = self.rt, self.phases
        engine = parking(rt.engine)
        before = rt.state
        assert engine is not None and before.phase is Phase.READY
        # A last look at the engine's own queue (a render queued since the last poll), while
        # the target still serves: a request that arrives meanwhile is forwarded and counts.
        if before.endpoints:
            await self.accounting.check_busy(before.endpoints[0])
        if not self._idle_for(idle_needed):
            return  # activity came meanwhile: decided again
        rt.park_asked = False
        # From here new requests are held (and wake it once the park is done).
        phases.publish(rt.state.with_phase(Phase.PARKED, self.now, reason=reason, parking=True))
        if self.others is not None and not self.keda:
            refused = await self.fencing.fence_all(self.others, idle_needed)
            if refused is not None:
                log.info("%s: park put off: %s", rt.name, refused)
                self.fencing.release_not_before = self.now + self.others.poll_interval
                phases.publish(dataclasses.replace(before, reason=f"park put off: {refused}"))
                return
        try:
            for endpoint in before.endpoints:
                await engine.park(endpoint)
        except ParkError as exc:
            await self.stop_instead(f"the park failed ({exc})")
            return
        rt.metrics.parks.labels(rt.name).inc()
        if displaced and rt.pool is not None:
            rt.metrics.pool_displacements.labels(rt.pool.name, rt.name, "park").inc()
        phases.publish(rt.state.with_phase(Phase.PARKED, self.now, reason=reason, parking=False))
        if self.others is not None and not self.keda:
            await self.others.parked_others(rt.name)

    async def wake(self, reason: str) -> None:
        rt, phases = self.rt, self.phases
        engine = parking(rt.engine)
        assert engine is not None
        state = rt.state
        endpoints = phases.observation.endpoints or state.endpoints
        phases.publish(
            state.with_phase(
                Phase.PARKED, self.now, reason=f"waking: {reason}", waking=True, waiting_for=""
            )
        )
        try:
            for endpoint in endpoints:
                await engine.wake(endpoint)
        except ParkError as exc:
            await self.stop_instead(f"the wake failed ({exc})")
            return
        phases.next_probe = self.now

    async def probe(self, endpoint: str) -> bool:
        """While waking: ready when the engine's readiness probe passes (its warm-up included)
        and the engine does not say it is still parked."""
        rt = self.rt
        if not await rt.engine.probe_ready(endpoint):
            return False
        engine = parking(rt.engine)
        return engine is None or await engine.is_parked(endpoint) is not True

    def woke(self) -> None:
        """Ready again: the wake is learned, and a fresh idle window begins."""
        rt, phases, now = self.rt, self.phases, self.now
        seconds = now - rt.state.since
        rt.metrics.wake_seconds.labels(rt.name).observe(seconds)
        rt.record_wake(seconds)
        rt.activity.wanted_until = float("-inf")
        rt.activity.last_request = now
        self.accounting.restart()
        phases.publish(
            rt.state.with_phase(
                Phase.READY,
                now,
                endpoints=phases.observation.endpoints,
                reason=f"woke in {seconds:.1f}s",
                waking=False,
                failures=0,
            )
        )

    async def stop_instead(self, why: str) -> None:
        """A park or wake that failed: the target is stopped (the next request starts it cold);
        where this replica may not stop it (KEDA owns it, or another replica leads), it is
        marked failed, and released by idleness like any failed start."""
        rt, phases = self.rt, self.phases
        log.warning("%s: %s; stopping it instead", rt.name, why)
        if self.keda or (self.others is not None and not self.others.leading()):
            phases.fail(why)
            return
        phases.publish(
            rt.state.with_phase(
                Phase.DRAINING, self.now, reason=why, stopping=True, parking=False, waking=False
            )
        )
        await phases.close_streams()
        await rt.backend.scale_down()
        phases.cold(f"stopped: {why}")
