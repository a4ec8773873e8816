"""Response-head deadlines: one timer per pool, not one per request. Exchanges wait in one
queue per timeout, so each queue is in deadline order and expiring looks at its front only."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Timed(Protocol):
    """What waits for a head: told when its time is up."""

    def timed_out(self, seconds: float) -> None: ...


class HeadWatch:
    """The exchanges waiting for a head with one timeout, in deadline order."""

    __slots__ = ("timeout", "waiting")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.waiting: dict[Timed, float] = {}

    def forget(self, item: Timed) -> None:
        """``item`` has its head, or will never have it: no deadline for it any more."""
        self.waiting.pop(item, None)


class HeadDeadlines:
    """Calls ``timed_out`` on whatever still waits for its head at its deadline."""

    __slots__ = ("_at", "_loop", "_timer", "_watches")

    def __init__(self) -> None:
        self._watches: dict[float, HeadWatch] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0

    def watch(self, item: Timed, timeout: float, loop: asyncio.AbstractEventLoop) -> HeadWatch:
        """Time ``item`` out after ``timeout`` seconds unless the watch returned forgets it."""
        self._loop = loop
        deadline = loop.time() + timeout
        watch = self._watches.get(timeout)
        if watch is None:
            watch = self._watches[timeout] = HeadWatch(timeout)
        watch.waiting[item] = deadline
        if self._timer is None or deadline < self._at:
            if self._timer is not None:
                self._timer.cancel()
            self._at = deadline
            self._timer = loop.call_at(deadline, self._expire)
        return watch

    def _expire(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        now = loop.time()
        soonest: float | None = None
        for timeout, watch in self._watches.items():
            waiting = watch.waiting
            while waiting:
                item, deadline = next(iter(waiting.items()))
                if deadline > now:
                    soonest = deadline if soonest is None else min(soonest, deadline)
                    break
                del waiting[item]
                item.timed_out(timeout)
        if soonest is not None:
            self._at = soonest
            self._timer = loop.call_at(soonest, self._expire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
