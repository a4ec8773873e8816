"""The parked tier, one target's side of it: parking (the engine drops its weights from the GPU,
its process or pod stays), waking (it loads them again, probed like a start), and stopping
instead when either fails (docs/pools.md).

A park is decided like a release (:func:`router.scale.scaling.decide`: idle for ``park_after``,
or chosen to make room in a GPU pool, or asked for) and decided again after a last look at the
engine's queue; every phase change is the machine's. With several replicas only the leader
parks, with the others fenced first, as it releases."""

from __future__ import annotations

import logging

from backends.base import ParkError, parking
from router.scale.coordination import Others
from router.scale.fencing import Fencing
from router.scale.machine import Event, Machine
from router.scale.release import Release
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


class Parking:
    def __init__(self, release: Release) -> None:
        """Parks with the parts a release has (the target, its machine, the fences, the
        other replicas), and stops instead through it."""
        self.release = release
        self.rt: TargetRuntime = release.rt
        self.machine: Machine = release.machine
        self.fencing: Fencing = release.fencing
        self.others: Others | None = release.others

    @property
    def keda(self) -> bool:
        return self.release.keda

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    async def park(self, reason: str, idle_needed: float, *, displaced: bool = False) -> None:
        rt, machine = self.rt, self.machine
        engine = parking(rt.engine)
        assert engine is not None
        rt.park_asked = False
        endpoints = rt.state.endpoints
        # From here new requests are held (and wake it once the park is done).
        machine.apply(Event.PARK, reason)
        if self.others is not None and not self.keda:
            refused = await self.fencing.fence_all(self.others, idle_needed)
            if refused is not None:
                log.info("%s: park put off: %s", rt.name, refused)
                self.fencing.put_off(self.others)
                machine.apply(Event.PUT_OFF, f"park put off: {refused}")
                return
        try:
            for endpoint in endpoints:
                await engine.park(endpoint)
        except ParkError as exc:
            await self.release.stop_instead(f"the park failed ({exc})")
            return
        rt.metrics.parks.labels(rt.name).inc()
        if displaced and rt.pool is not None:
            rt.metrics.pool_displacements.labels(rt.pool.name, rt.name, "park").inc()
        machine.apply(Event.PARKED, reason)
        if self.others is not None and not self.keda:
            await self.others.parked_others(rt.name)

    async def wake(self, reason: str) -> None:
        rt = self.rt
        engine = parking(rt.engine)
        assert engine is not None
        endpoints = rt.backend.observe().endpoints or rt.state.endpoints
        self.machine.apply(Event.WAKE, f"waking: {reason}")
        try:
            for endpoint in endpoints:
                await engine.wake(endpoint)
        except ParkError as exc:
            await self.release.stop_instead(f"the wake failed ({exc})")

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
        rt, now = self.rt, self.now
        seconds = now - rt.state.since
        rt.metrics.wake_seconds.labels(rt.name).observe(seconds)
        rt.learned.wake(seconds)
        rt.activity.wanted_until = float("-inf")
        rt.activity.last_request = now
        endpoints = rt.backend.observe().endpoints
        self.machine.apply(Event.WOKE, f"woke in {seconds:.1f}s", endpoints=endpoints)
