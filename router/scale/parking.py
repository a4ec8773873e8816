"""The parked tier, what one target's engine is asked: to drop its weights from the GPU (its
process or pod stays), to load them again, and whether it is awake (docs/pools.md).

A park is decided like a release (:func:`router.scale.scaling.decide`: idle for ``park_after``,
or chosen to make room in a GPU pool, or asked for) and decided again after a last look at the
engine's queue; the park and wake steps (their events, the stop instead when either fails, the
fences of the other replicas) are :mod:`router.scale.steps`'; every phase change is the
machine's."""

from __future__ import annotations

from backends.base import Parkable, parking
from router.scale.targets import TargetRuntime


class Parking:
    def __init__(self, runtime: TargetRuntime) -> None:
        self.rt = runtime

    def _engine(self) -> Parkable:
        engine = parking(self.rt.engine)
        assert engine is not None
        return engine

    async def park(self, endpoints: tuple[str, ...]) -> None:
        """Each endpoint's engine drops its weights (:class:`backends.base.ParkError`: it could
        not)."""
        engine = self._engine()
        for endpoint in endpoints:
            await engine.park(endpoint)

    async def wake(self, endpoints: tuple[str, ...]) -> None:
        """Each endpoint's engine loads its weights again (``ParkError``: it could not)."""
        engine = self._engine()
        for endpoint in endpoints:
            await engine.wake(endpoint)

    async def probe(self, endpoint: str) -> bool:
        """While waking: ready when the engine's readiness probe passes (its warm-up included)
        and the engine does not say it is still parked."""
        rt = self.rt
        if not await rt.engine.probe_ready(endpoint):
            return False
        engine = parking(rt.engine)
        return engine is None or await engine.is_parked(endpoint) is not True

    def woke(self, seconds: float) -> None:
        """Ready again after ``seconds``: the wake is learned, and a fresh idle window begins."""
        rt = self.rt
        rt.learned.wake(seconds)
        rt.activity.wanted_until = float("-inf")
        rt.activity.last_request = rt.loop.time()
