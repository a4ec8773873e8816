"""One GPU pool at run time: the targets that take turns on it, the pool's plan over a snapshot
of them (:func:`router.scale.pools.plan`: who goes, who makes room, who waits for what), and
its gauge. Each member's lifecycle reads the plan and acts on its own part; a member whose
state changes makes the others look again (docs/pools.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from backends.base import parking
from router.config.pools import Pool
from router.metrics import Metrics
from router.scale.coordination import Others
from router.scale.pools import Member, Plan, Wait, plan
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime


def doing(
    runtime: TargetRuntime, now: float, idle_since: float | None, kept: bool, yield_after: float
) -> str:
    """What a member does now, in a few words, for the waiting page and the log (words that
    change only when what it does changes: a wait's reason is published when it changes)."""
    state, activity = runtime.state, runtime.activity
    if state.phase is Phase.STARTING:
        return "starting"
    if state.phase is Phase.DRAINING:
        return "being stopped"
    if state.phase is Phase.PARKED:
        return "being parked" if state.parking else ("waking" if state.waking else "parked")
    if state.phase is not Phase.READY:
        return str(state.phase.value)
    if activity.busy_until > now:
        return "rendering"
    if activity.in_flight:
        n = activity.in_flight
        return f"serving {n} request{'s' if n != 1 else ''}"
    if kept:
        return "kept warm (keep_warm)"
    if idle_since is None:
        return "in use"
    if now - idle_since < yield_after:
        return f"in use (idle for less than {yield_after:g}s)"
    return "idle"


class PoolRuntime:
    def __init__(
        self,
        name: str,
        spec: Pool,
        members: Sequence[TargetRuntime],
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        others: Others | None = None,
    ) -> None:
        self._name = name
        self.spec = spec
        self.members = list(members)
        self.loop = loop
        self.others = others
        """Several warmgate replicas: idleness is theirs together (as for a release)."""
        self._since: dict[str, float] = {}
        """Member -> loop time it began to want its turn (first come, first served)."""
        metrics.pool_resident.labels(name).set_function(self.resident)
        for runtime in self.members:
            runtime.pool = self
            runtime.cell.subscribe(self._changed)

    @property
    def name(self) -> str:
        return self._name

    @property
    def yield_after(self) -> float:
        return self.spec.yield_after

    @property
    def capacity(self) -> int:
        return self.spec.capacity

    def resident(self) -> int:
        return sum(1 for runtime in self.members if runtime.state.resident)

    def _changed(self, old: TargetState, new: TargetState) -> None:
        if (old.phase, old.resident, old.waiting_for) != (new.phase, new.resident, new.waiting_for):
            self.poke()

    def poke(self) -> None:
        for runtime in self.members:
            runtime.nudge.set()

    def member(self, runtime: TargetRuntime, now: float, want: bool = False) -> Member:
        """One member as it is now; ``want``: as if a request waited for it."""
        state, activity = runtime.state, runtime.activity
        window = runtime.spec.scaling.stream_activity_window
        if self.others is not None:
            idle_since = self.others.idle_since(runtime.name)
        else:
            idle_since = activity.idle_since(window)
        kept, _ = runtime.learned.idling.kept_warm(runtime.learned.predicted_cold_start())
        wants = not state.resident and (
            want
            or activity.held > 0
            or now < activity.wanted_until
            or (self.others is not None and self.others.wanted(runtime.name))
        )
        since = self._since.get(runtime.name, now) if want else now
        if not want:
            if wants:
                since = self._since.setdefault(runtime.name, now)
            else:
                self._since.pop(runtime.name, None)
        return Member(
            name=runtime.name,
            priority=runtime.spec.priority,
            resident=state.resident,
            ready=state.phase is Phase.READY,
            idle_since=None if kept else idle_since,
            held=activity.held,
            wants=wants,
            waiting_since=since,
            can_park=parking(runtime.engine) is not None,
            leaving=state.phase is Phase.DRAINING
            or (state.phase is Phase.PARKED and state.parking),
            doing=doing(runtime, now, idle_since, kept, self.spec.yield_after),
        )

    def plan(self) -> Plan:
        now = self.loop.time()
        members = [self.member(runtime, now) for runtime in self.members]
        return plan(members, self.spec.capacity, self.spec.yield_after, now, self.name)

    def wait_if_wanted(self, target: str) -> Wait | None:
        now = self.loop.time()
        members = [self.member(rt, now, want=rt.name == target) for rt in self.members]
        return plan(members, self.spec.capacity, self.spec.yield_after, now, self.name).turn(target)
