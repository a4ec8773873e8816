"""A virtual clock for the replay: an asyncio event loop whose time jumps to the next timer
whenever nothing is ready to run.

The replay does no I/O (no socket, no child process: the backends are simulated), so waiting in
the selector is never needed: when every task waits, the loop moves its clock to the earliest
timer and runs it. A day of timers replays as fast as the callbacks themselves run. The code
under replay reads time through the loop (``loop.time()``, ``asyncio.sleep``,
``asyncio.timeout``), as it does live, so it never knows."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any


class Stalled(RuntimeError):
    """Every task waits and no timer is set: the replay can never go on."""


class _NoIO(selectors.BaseSelector):
    """A selector that never waits: a positive timeout moves the loop's clock instead."""

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(
        self, fileobj: Any, events: int, data: Any = None
    ) -> selectors.SelectorKey:  # the loop's own self-pipe is registered, never read
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise Stalled("every task waits and no timer is set")
        if timeout > 0:
            self.loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, starting at ``start`` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _NoIO()
        self._now = start
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
