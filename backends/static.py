"""``kind: static``: an always-on URL. Nothing to start or stop; always ready."""

from __future__ import annotations

from backends.base import Observation, ObservationListener
from backends.specs import StaticSpec


class StaticBackend:
    def __init__(self, spec: StaticSpec) -> None:
        self._observation = Observation(running=True, endpoints=(spec.url,))

    @property
    def always_on(self) -> bool:
        return True

    def observe(self) -> Observation:
        return self._observation

    async def open(self, listener: ObservationListener) -> None:
        listener(self._observation)

    async def scale_up(self) -> None:
        return None

    async def scale_down(self, deadline: float | None = None) -> None:
        return None

    async def close(self) -> None:
        return None
