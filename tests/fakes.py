"""Fake twins of the backend and engine protocols, shared by the tests of the pure and
lifecycle parts. They speak the same protocol as the real ones (backends/base.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from backends.base import (
    Observation,
    ObservationListener,
    ParkError,
    RequestFacts,
    StreamActivity,
)


class FakeBackend:
    """Scales instantly (or when told to); records every call."""

    def __init__(self, endpoint: str = "http://127.0.0.1:1") -> None:
        self.endpoint = endpoint
        self.calls: list[str] = []
        self._observation = Observation()
        self._listener: ObservationListener | None = None
        self.fail_start: str | None = None
        self.stop_gate: asyncio.Event | None = None
        """When set, scale_down waits for this event (to hold the drain mid-stop)."""

    @property
    def always_on(self) -> bool:
        return False

    def observe(self) -> Observation:
        return self._observation

    def set(self, observation: Observation) -> None:
        self._observation = observation
        if self._listener is not None:
            self._listener(observation)

    async def open(self, listener: ObservationListener) -> None:
        self._listener = listener

    async def scale_up(self) -> None:
        self.calls.append("up")
        if self.fail_start:
            self.set(Observation(failure=self.fail_start, crashed=True))
        else:
            self.set(Observation(running=True, endpoints=(self.endpoint,)))

    async def scale_down(self, deadline: float | None = None) -> None:
        self.calls.append("down")
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.set(Observation())

    def crash(self, reason: str = "exited with code 137") -> None:
        self.set(Observation(failure=reason, crashed=True))

    async def close(self) -> None:
        self.calls.append("close")


class FakeEngine:
    """Ready once ``ready_at`` (loop time) has passed; busy while ``busy`` is True."""

    def __init__(self) -> None:
        self.ready_at = 0.0
        self.busy_now = False
        self.probes = 0
        self.during_busy_check: Callable[[], Awaitable[None]] | None = None
        """Awaited inside each busy check (to play out what arrives meanwhile)."""

    async def probe_ready(self, base_url: str) -> bool:
        self.probes += 1
        return asyncio.get_running_loop().time() >= self.ready_at

    async def busy(self, base_url: str) -> bool:
        if self.during_busy_check is not None:
            await self.during_busy_check()
        return self.busy_now

    def may_start(self, facts: RequestFacts) -> bool:
        return not facts.is_websocket

    def stream_activity(self, path: str) -> StreamActivity:
        return "frames"

    async def close(self) -> None:
        return None


class FakeParkingEngine(FakeEngine):
    """A :class:`FakeEngine` that parks (:class:`backends.base.Parkable`): parked, it says so;
    woken, it is ready ``wake_seconds`` later. Records every park and wake."""

    def __init__(self, wake_seconds: float = 1.0) -> None:
        super().__init__()
        self.wake_seconds = wake_seconds
        self.parked = False
        self.calls: list[str] = []
        self.fail_park: str | None = None
        self.fail_wake: str | None = None
        self.park_seconds = 0.0
        """How long dropping the weights takes."""

    @property
    def parks(self) -> bool:
        return True

    async def park(self, base_url: str) -> None:
        self.calls.append("park")
        await asyncio.sleep(self.park_seconds)
        if self.fail_park is not None:
            raise ParkError(self.fail_park)
        self.parked = True

    async def wake(self, base_url: str) -> None:
        self.calls.append("wake")
        if self.fail_wake is not None:
            raise ParkError(self.fail_wake)
        self.parked = False
        self.ready_at = asyncio.get_running_loop().time() + self.wake_seconds

    async def is_parked(self, base_url: str) -> bool | None:
        return self.parked
