"""A target's state: one immutable snapshot, replaced whole and broadcast.

Readers (the proxy, holds, the admin page, the policy) read ``cell.current`` without locking;
only the target's lifecycle writes, through :meth:`StateCell.replace`, which tells every waiter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

from backends.base import Stage


class Phase(enum.Enum):
    COLD = "cold"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    PARKED = "parked"
    """Between ready and cold: the engine dropped its weights from the GPU, its process (or pod)
    stays; a request wakes it in about a second instead of a cold start (docs/pools.md)."""


@dataclass(frozen=True, slots=True)
class TargetState:
    phase: Phase
    since: float
    """Loop time at which this phase began."""
    endpoints: tuple[str, ...] = ()
    """Base URLs to forward to; non-empty only when ``ready`` (or ``draining`` before the stop)."""
    reason: str = ""
    """Why the phase is what it is (for logs, the admin page and the waiting page)."""
    stage: Stage | None = None
    """In ``starting``: where the start is (``scheduling``, ``unschedulable``, ``preempting``,
    ``pulling``, ``starting``, ``loading``); ``None`` where the backend cannot tell."""
    stage_message: str = ""
    """The stage in the cluster's own words (the scheduler's, while ``unschedulable``)."""
    stage_since: float = 0.0
    """Loop time the stage began."""
    progress: float | None = None
    """While ``loading``: the engine's own load progress (0..1), where it reports one."""
    failures: int = 0
    """Consecutive failed cold starts; reset by a successful one."""
    restarts: int = 0
    """In ``starting``: times this start's workload was started again after it exited before
    it was ever ready (``scaling.start_retries``)."""
    retry_at: float = 0.0
    """In ``failed``: loop time after which a new start may be tried."""
    told: str = ""
    """In ``failed``: what requests held for the start are told of why, the engine's own
    reason where its readiness answer said failed, or the exception a child's stderr ended
    with; empty for a backend's other failures (a command, a pod), whose words stay in the log
    and on the operator's pages."""
    stopping: bool = False
    """In ``draining``: the stop has been issued, so a new request must wait for the next start."""
    parking: bool = False
    """In ``parked``: the engine is being asked to drop its weights (they are still on the GPU)."""
    waking: bool = False
    """In ``parked``: the engine is loading its weights again; held requests wait for ready."""
    waiting_for: str = ""
    """Cold or parked with work waiting, in a full GPU pool: what the start or wake waits for
    (``waiting for the GPU: wan2gp is rendering``); empty otherwise."""
    back_to: TargetState | None = None
    """While a drain or a park is under way: the snapshot it began from, what it goes back to
    when it is put off (:data:`router.scale.machine.BACK`); ``None`` otherwise."""

    @property
    def resident(self) -> bool:
        """Holding its GPU (or about to): what a pool's ``capacity`` counts."""
        if self.phase is Phase.PARKED:
            return self.parking or self.waking
        return self.phase in (Phase.STARTING, Phase.READY, Phase.DRAINING)

    def with_phase(self, phase: Phase, now: float, **changes: object) -> TargetState:
        if phase is not Phase.STARTING:  # a stage belongs to one start
            changes = {"stage": None, "stage_message": "", "progress": None, **changes}
        return dataclasses.replace(self, phase=phase, since=now, **changes)  # type: ignore[arg-type]


class StateCell:
    """Holds the current snapshot of one target; swaps it and tells every waiter at once.

    Each generation has its own event: ``replace`` sets the old one and installs a fresh one, so
    a waiter never misses a change and nobody holds a lock (a broadcast, not a queue).
    """

    def __init__(self, initial: TargetState) -> None:
        self.current = initial
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[TargetState, TargetState], None]] = []

    def subscribe(self, listener: Callable[[TargetState, TargetState], None]) -> None:
        """``listener(old, new)`` runs synchronously on every replacement."""
        self._listeners.append(listener)

    def replace(self, new: TargetState) -> None:
        old, self.current = self.current, new
        changed, self._changed = self._changed, asyncio.Event()
        for listener in self._listeners:
            listener(old, new)
        changed.set()

    def look_again(self) -> None:
        """Tell every waiter to look again without a change (warmgate is draining)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[TargetState], bool]) -> TargetState:
        """Wait until ``predicate(current)`` holds; returns that snapshot. No polling."""
        while not predicate(self.current):
            await self._changed.wait()
        return self.current
