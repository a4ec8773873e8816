"""A target's runtime and lifecycle over the fake backend and engine twins, as the lifecycle tests
drive it: wait for a phase, read a metric, serve a request on the test's fast-forwarded clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from backends.base import RequestFacts
from router.metrics import Metrics
from router.scale.lifecycle import Lifecycle
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from tests.fakes import FakeBackend, FakeEngine

GET = RequestFacts(method="GET", path="/", is_websocket=False, is_navigation=False)


@dataclass
class Rig:
    runtime: TargetRuntime
    backend: FakeBackend
    engine: FakeEngine
    lifecycle: Lifecycle
    metrics: Metrics
    labels: dict[str, str] = field(default_factory=dict)
    """Labels every sample read through ``metric`` carries (a call's own labels win)."""

    @property
    def phase(self) -> Phase:
        return self.runtime.state.phase

    async def until(self, phase: Phase, limit: float = 3600) -> None:
        """Until the target is in ``phase`` with no park or wake under way."""
        async with asyncio.timeout(limit):
            await self.runtime.cell.wait_for(
                lambda s: s.phase is phase and not s.waking and not s.parking
            )

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {**self.labels, **labels})
        return value or 0.0

    def serve(self, seconds: float) -> asyncio.Task[float]:
        """A request: held if needed, then in flight for ``seconds``; returns the hold time."""
        runtime = self.runtime

        async def request() -> float:
            held = await runtime.acquire(GET)
            with runtime.in_flight():
                await asyncio.sleep(seconds)
            return held.waited

        return asyncio.ensure_future(request())
