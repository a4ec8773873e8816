"""One request counted in flight, from the call that makes it to the end of its ``with``.

Counting is the call itself (no await before it), so a held request let go is never, even for
one turn of the loop, neither held nor in flight: the lifecycle cannot release under it. The
activity and the ``warmgate_in_flight`` gauge move together, and every begin has its end.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from router.http.runtime import Runtime


class InFlight:
    """Begun when made; ended once, on leaving its ``with`` (or ``async with``) block.

    ``counts=False``: in flight (no release meanwhile) but no use of the GPU, so neither its
    begin nor its end moves the idle clock (a tab's socket while its upstream connects)."""

    __slots__ = ("_counts", "_open", "_runtime")

    def __init__(self, runtime: Runtime, *, counts: bool = True) -> None:
        self._runtime, self._counts = runtime, counts
        runtime.activity.begin(runtime.loop.time(), counts=counts)
        runtime.m_in_flight.inc()
        self._open = True

    def end(self) -> None:
        """No longer in flight (idempotent): from here a stream counts by its frames or jobs."""
        if self._open:
            self._open = False
            runtime = self._runtime
            runtime.activity.end(runtime.loop.time(), counts=self._counts)
            runtime.m_in_flight.dec()

    def rejoin(self) -> None:
        """In flight again after :meth:`end`, without activity: the end that follows (leaving
        the block) leaves the idle clock alone, since the end of a stream is no activity."""
        if not self._open:
            self._open = True
            self._runtime.activity.rejoin()
            self._runtime.m_in_flight.inc()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()
