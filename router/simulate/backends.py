"""Simulated backends and engines for the replay: the :class:`backends.base.Backend` and
:class:`backends.base.Engine` protocols on the virtual clock, with no process and no socket.

A start takes the cold start the replay was given (sampled per start), a stop the stop time;
the engine is ready as soon as its endpoint is up and is busy while it works through its queue
of renders. Which requests wake a target is the real engine's rule (``wake_on``, page loads).
Where the real engine parks (:class:`backends.base.Parkable`), so does the simulated one: a
park takes :data:`PARK_SECONDS`, a wake the wake time the replay was given (sampled per wake)."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from backends.base import (
    Engine,
    Observation,
    ObservationListener,
    RequestFacts,
    StreamActivity,
    parking,
)
from backends.units import parse_duration
from router.config import Config
from router.scale.eta import ColdStarts
from router.scale.learned import LEARNED, WAKES
from router.scale.persist import FileStore, read_document
from router.scale.wakes import Wakes

_RANGE = re.compile(r"^\s*([^.\s]+)\s*\.\.\s*([^.\s]+)\s*$")
PARK_SECONDS = 1.0
"""A park: the engine frees its weights (ComfyUI's ``/free``, vLLM's ``/sleep``)."""


@dataclass(frozen=True, slots=True)
class Duration:
    """Seconds, fixed or drawn uniformly from ``[low, high]`` (``"60s"``, ``"45s..90s"``)."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> Duration:
        match = _RANGE.match(text)
        if match:
            low, high = parse_duration(match.group(1)), parse_duration(match.group(2))
            if low > high:
                raise ValueError(f"expected LOW..HIGH with LOW <= HIGH, got {text!r}")
            return cls(low, high)
        value = parse_duration(text)
        return cls(value, value)

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)

    def __str__(self) -> str:
        return f"{self.low:g}s" if self.low == self.high else f"{self.low:g}s..{self.high:g}s"


class SimBackend:
    """A workload that starts in ``cold_start`` seconds and stops in ``stop`` seconds."""

    def __init__(self, name: str, cold_start: Duration, stop: Duration, rng: random.Random) -> None:
        self.name = name
        self.cold_start = cold_start
        self.stop = stop
        self.rng = rng
        self._observation = Observation()
        self._listener: ObservationListener | None = None
        self._up: asyncio.TimerHandle | None = None
        self.starts = 0
        self.engine: SimEngine | None = None
        """Its engine: a stopped process is no longer parked."""

    @property
    def always_on(self) -> bool:
        return False

    def observe(self) -> Observation:
        return self._observation

    def _publish(self, observation: Observation) -> None:
        self._observation = observation
        if self._listener is not None:
            self._listener(observation)

    async def open(self, listener: ObservationListener) -> None:
        self._listener = listener

    async def scale_up(self) -> None:
        if self._observation.running:
            return
        self.starts += 1
        self._publish(Observation(running=True))
        loop = asyncio.get_running_loop()
        self._up = loop.call_later(self.cold_start.draw(self.rng), self._came_up)

    def _came_up(self) -> None:
        self._up = None
        self._publish(Observation(running=True, endpoints=(f"sim://{self.name}",)))

    async def scale_down(self, deadline: float | None = None) -> None:
        if self._up is not None:
            self._up.cancel()
            self._up = None
        if not self._observation.running:
            return
        await asyncio.sleep(self.stop.draw(self.rng))
        if self.engine is not None:
            self.engine.parked = False
        self._publish(Observation())

    async def close(self) -> None:
        if self._up is not None:
            self._up.cancel()
        self._listener = None


class SimEngine:
    """Ready once up; busy while its queue of work runs; the real engine's wake rules; parked
    and woken where the real engine has a park action."""

    def __init__(
        self,
        real: Engine,
        loop: asyncio.AbstractEventLoop,
        wake: Duration | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.real = real
        self.loop = loop
        self.free_at = 0.0
        """Loop time at which the queued work is done (one GPU: renders run one at a time)."""
        self.wake_time = wake or Duration(2.0, 2.0)
        self.rng = rng or random.Random(0)
        self._parks = parking(real) is not None
        self.parked = False

    @property
    def parks(self) -> bool:
        return self._parks

    async def park(self, base_url: str) -> None:
        await asyncio.sleep(PARK_SECONDS)
        self.parked = True

    async def wake(self, base_url: str) -> None:
        """Returns once the weights are back (a wake's whole time), as vLLM's ``/wake_up``."""
        if self.parked:
            await asyncio.sleep(self.wake_time.draw(self.rng))
        self.parked = False

    async def is_parked(self, base_url: str) -> bool | None:
        return self.parked

    def queue(self, seconds: float) -> float:
        """Queue ``seconds`` of GPU work; the loop time it will be done."""
        self.free_at = max(self.free_at, self.loop.time()) + seconds
        return self.free_at

    async def probe_ready(self, base_url: str) -> bool:
        return True

    async def busy(self, base_url: str) -> bool:
        return self.loop.time() < self.free_at

    def may_start(self, facts: RequestFacts) -> bool:
        return self.real.may_start(facts)

    def stream_activity(self, path: str) -> StreamActivity:
        return self.real.stream_activity(path)

    async def close(self) -> None:
        await self.real.close()


class MemoryStore:
    """A target's learned figures (the cold starts, ``idle_after: auto``'s histogram) kept
    from one replay to the next, as a state file or a Deployment's annotations keep them
    across restarts: replay last week into it, then this week starts from what it learned."""

    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}

    @property
    def where(self) -> str:
        return "the replay's memory"

    def name_of(self, key: str) -> str:
        return f"{key} in the replay's memory"

    async def load(self, key: str) -> dict[str, Any] | None:
        document = self.documents.get(key)
        return None if document is None else dict(document)

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.documents.items() if k.startswith(prefix)}

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        self.documents[key] = dict(document)


@dataclass(frozen=True, slots=True)
class Measured:
    """A target's cold starts (or wakes from parked) as ``warmgate serve`` measured and kept
    them (``state_dir``)."""

    duration: Duration
    """Drawn uniformly between the shortest and the longest kept."""
    starts: int
    """How many were kept (cold starts, or wakes)."""
    where: str


def measured_cold_starts(config: Config) -> dict[str, Measured]:
    """Per target: the cold starts the live server kept in ``config``'s ``state_dir``
    (``<target>.cold-start.json``, the last twenty), where there are any. A cluster's are on
    its Deployments, out of a replay's reach."""

    def starts(document: Mapping[str, Any]) -> list[float]:
        learned = ColdStarts(0.0)
        return list(learned.history) if learned.restore(document) else []

    return _measured(config, LEARNED, starts)


def measured_wakes(config: Config) -> dict[str, Measured]:
    """Per target: the wakes from parked the live server kept in ``config``'s ``state_dir``
    (``<target>.wake.json``, the last twenty), where there are any."""

    def wakes(document: Mapping[str, Any]) -> list[float]:
        learned = Wakes()
        return list(learned.history) if learned.load(document) else []

    return _measured(config, WAKES, wakes)


def _measured(
    config: Config, key: str, read: Callable[[Mapping[str, Any]], list[float]]
) -> dict[str, Measured]:
    directory = config.state_path
    out: dict[str, Measured] = {}
    if directory is None:
        return out
    for name in config.targets:
        path = FileStore(directory, f"{name}.").path(key)
        document = read_document(path)  # a FIFO or a 1 GiB file there: refused, not read
        seen = [] if document is None else read(document)
        if seen:
            out[name] = Measured(Duration(min(seen), max(seen)), len(seen), str(path))
    return out
