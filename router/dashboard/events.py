"""The event bus of the operator's view: the last 200 events (phase changes, starts, releases,
failures, the operator's actions, changes of leader), and a broadcast that something changed.

Fed synchronously by the targets' state cells (:meth:`router.scale.state.StateCell.subscribe`):
a listener never awaits and never raises into the lifecycle that published the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.dashboard.today import Today
from router.scale.state import Phase, StateCell, TargetState

log = logging.getLogger("warmgate.dashboard")

KEPT = 200
"""Events kept (and shown), newest first."""


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    at: float
    """Wall-clock time."""
    target: str | None
    kind: str
    """start, ready, drain, release, lost, failure, endpoints, starting (a replacement awaited),
    park, wake (from parked), an action ("wake asked", "release asked", "park asked"),
    leader, or rollout (a new version declared, verified, or not converged in time)."""
    reason: str
    phase: str | None = None
    previous: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "at": round(self.at, 3),
            "target": self.target,
            "kind": self.kind,
            "phase": self.phase,
            "from": self.previous,
            "reason": self.reason,
        }


def kind_of(old: TargetState, new: TargetState) -> str | None:
    """What a state change is called on the dashboard; ``None``: not an event of its own."""
    if old.phase is new.phase:
        if new.phase is Phase.PARKED and new.waking and not old.waking:
            return "wake"
        return "endpoints" if new.endpoints != old.endpoints and new.endpoints else None
    if new.phase is Phase.STARTING:
        return "start" if old.phase in (Phase.COLD, Phase.FAILED) else "starting"
    if new.phase is Phase.COLD:
        return "release" if old.phase is Phase.DRAINING else "lost"
    names = {
        Phase.READY: "ready",
        Phase.DRAINING: "drain",
        Phase.FAILED: "failure",
        Phase.PARKED: "park",
    }
    return names.get(new.phase, str(new.phase.value))


class EventBus:
    def __init__(self, today: Today, loop: asyncio.AbstractEventLoop) -> None:
        self.today = today
        self.loop = loop
        self.events: deque[Event] = deque(maxlen=KEPT)
        self.seq = 0
        self.closed = False
        self._poked = asyncio.Event()

    def watch(self, name: str, cell: StateCell) -> None:
        cell.subscribe(lambda old, new: self._on_state(name, old, new))

    def follow_rollouts(self, name: str, listeners: list[Callable[[str], None]]) -> None:
        """``rollout`` events: a target's rollouts as :mod:`router.scale.rollout` tells them."""

        def told(words: str) -> None:
            self.add(name, "rollout", words)

        listeners.append(told)

    def _on_state(self, name: str, old: TargetState, new: TargetState) -> None:
        try:
            self.today.on_state(name, old, new)
            kind = kind_of(old, new)
            if kind is not None:
                reason = new.reason
                if kind == "endpoints":
                    reason = "ready endpoints now " + ", ".join(new.endpoints)
                self.add(name, kind, reason, new.phase.value, old.phase.value)
            self.poke()
        except Exception:  # the lifecycle that published must never see the dashboard fail
            log.exception("%s: recording a state change failed", name)

    def add(
        self,
        target: str | None,
        kind: str,
        reason: str,
        phase: str | None = None,
        previous: str | None = None,
    ) -> Event:
        self.seq += 1
        at = self.today.wall(self.loop.time())
        event = Event(self.seq, at, target, kind, reason, phase, previous)
        self.events.append(event)
        self.poke()
        return event

    def newer_than(self, seq: int) -> list[Event]:
        """Events after ``seq``, oldest first."""
        return [event for event in self.events if event.seq > seq]

    def poke(self) -> None:
        """Something changed: the publisher looks again now."""
        self._poked.set()

    async def poked(self, timeout: float) -> None:  # noqa: ASYNC109 - a wait with a period
        """Wait for a poke, at most ``timeout`` seconds; the poke is consumed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._poked.wait()
        self._poked.clear()

    def close(self) -> None:
        self.closed = True
        self.poke()
