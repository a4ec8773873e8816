"""Turns among the requests a start releases (``waiting.release_rate``).

A start's burst (requests held through it, waiting pages that continue) goes on at most
``rate`` a second, so a Gradio app is not flooded the instant it is ready. Only waiters that
exist are counted: a waiter is in line while its task waits, and leaves the line however its wait
ends (its turn came, its client went away, its deadline passed). Nothing is reserved ahead, so a
client that goes away holds no one back.
"""

from __future__ import annotations

import asyncio

from router.scale.hold import release_at


class Turns:
    """One target's line of waiters for a turn; the one at its head goes on when the pace
    allows, the others wait to be at the head."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float | None) -> None:
        self.loop = loop
        self.rate = rate
        """Turns a second; ``None``: no pacing, every waiter goes on at once."""
        self._line: dict[object, asyncio.Future[None]] = {}
        """The waiters in the order they came; each one's future is set once it is at the
        head. A dict: one that leaves from the middle is taken out at once."""
        self._next_free = float("-inf")
        """From when the next turn may be given (the last one given, plus the pace)."""

    @property
    def waiting(self) -> int:
        """Waiters in line now."""
        return len(self._line)

    async def take(self) -> None:
        """Wait for this task's turn. A caller bounds the wait with its own deadline
        (``asyncio.timeout_at``); cancelled, it leaves the line and the next one moves up."""
        if self.rate is None:
            return
        key = object()
        head = self.loop.create_future()
        self._line[key] = head
        try:
            if len(self._line) == 1:
                head.set_result(None)
            await head
            while True:
                now = self.loop.time()
                at, after = release_at(self._next_free, now, self.rate)
                if at <= now:
                    self._next_free = after
                    return
                await asyncio.sleep(at - now)
        finally:
            del self._line[key]
            following = next(iter(self._line.values()), None)
            if following is not None and not following.done():
                following.set_result(None)
