"""Fences between warmgate replicas, one target's side of them (docs/replicas.md).

Fenced: the leader of the replicas is about to release the target, and this replica, idle too,
holds new requests from then until the release shows (the workload gone), the leader calls it
off, or the fence runs out. Fencing: this replica leads and releases the target itself, with
every other one fenced first, and the stop stored before the fences could run out."""

from __future__ import annotations

import logging
import math

from router.scale.coordination import Others
from router.scale.deadline import idle_reached
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime
from router.scale.transitions import Transitions

log = logging.getLogger("warmgate.lifecycle")


class Fencing:
    def __init__(self, runtime: TargetRuntime, phases: Transitions) -> None:
        self.rt = runtime
        self.phases = phases
        self.fenced_until = -math.inf
        """Draining for the leader's release: serving again at this loop time if the workload
        still runs then; ``-inf``: not fenced."""
        self.fenced_by = ""
        self.release_not_before = -math.inf
        """A release was just put off (another replica was active): not again before this."""

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def fenced(self) -> bool:
        return not math.isinf(self.fenced_until)

    # -- fenced by the leader -------------------------------------------------------------

    def fence(self, until: float, leader: str, needed: float | None = None) -> str | None:
        """Another replica, the leader, is about to release this target: if this replica is
        idle too, hold new requests from now until the release shows (or ``until``).
        ``needed``: the idleness the leader's step needs (a park's is shorter than
        ``idle_after``); ``None``: a release's."""
        rt, now = self.rt, self.now
        state, activity = rt.state, rt.activity
        if state.phase in (Phase.COLD, Phase.FAILED):
            return None if activity.held == 0 else "requests are held here"
        if state.phase is Phase.STARTING:
            return "starting here (probing the workload)"
        if state.phase is Phase.DRAINING and state.stopping:
            if self.fenced:
                self.fenced_until = max(self.fenced_until, until)
            return None
        idle_since = activity.idle_since(rt.spec.scaling.stream_activity_window)
        if activity.held or idle_since is None:
            return "active here"
        idle = now - idle_since
        if not idle_reached(now, idle_since, rt.idle_after() if needed is None else needed):
            return f"idle for only {idle:.1f}s here"
        self.fenced_until, self.fenced_by = until, leader
        reason = f"{leader} is releasing it (idle for {idle:.0f}s here too)"
        self.phases.publish(rt.state.with_phase(Phase.DRAINING, now, reason=reason, stopping=True))
        rt.wake.set()
        return None

    def unfence(self, reason: str, parked: bool = False) -> None:
        """The fence ends: serving again, or, when the leader parked the target (``parked``),
        parked here too (the next request wakes it)."""
        if not self.fenced:
            return
        self.fenced_until = -math.inf
        rt = self.rt
        if rt.state.phase is Phase.DRAINING and rt.state.stopping:
            endpoints = self.phases.observation.endpoints
            if parked and endpoints:
                reason = f"parked by {self.fenced_by}"
                self.phases.publish(
                    rt.state.with_phase(
                        Phase.PARKED, self.now, endpoints=endpoints, reason=reason, stopping=False
                    )
                )
            elif endpoints:
                self.phases.publish(
                    rt.state.with_phase(
                        Phase.READY, self.now, endpoints=endpoints, reason=reason, stopping=False
                    )
                )
            else:  # the pod went meanwhile: wait for one, probed like any start
                self.phases.starting(reason, endpoints=(), stopping=False)
        rt.wake.set()

    async def released(self) -> bool:
        """The workload is gone: if this replica was fenced, the leader released it (-> cold,
        streams closed); ``False`` when it was not fenced."""
        if not self.fenced:
            return False
        self.fenced_until = -math.inf
        self.phases.cold(f"released by {self.fenced_by}")
        await self.phases.close_streams()
        return True

    # -- fencing the others, as the leader ------------------------------------------------

    async def release(
        self, others: Others, before: TargetState, reason: str, needed: float | None = None
    ) -> None:
        """The leader's release: fence the other replicas, confirm the leadership, stop, all
        before the fences could run out (half of ``fence_timeout``); or put it off."""
        rt = self.rt
        deadline = self.now + others.fence_timeout / 2
        refused = await self._fence_others(others, needed)
        if refused is None and self.now >= deadline:
            refused = "fencing took too long"
            await others.unfence_others(rt.name)
        if refused:
            log.info("%s: release put off: %s", rt.name, refused)
            self.release_not_before = self.now + others.poll_interval
            self.phases.back_to(before, f"release put off: {refused}")
            return
        await rt.backend.scale_down(deadline)
        if rt.backend.observe().running:  # the stop could not be stored in time
            await others.unfence_others(rt.name)
            self.release_not_before = self.now + others.poll_interval
            self.phases.back_to(before, "release put off: the stop could not be made in time")
            return
        rt.metrics.idle_releases.labels(rt.name).inc()
        self.phases.cold(reason)
        await self.phases.close_streams()

    async def fence_all(self, others: Others, needed: float | None = None) -> str | None:
        """Every other replica fenced and the leadership confirmed, within half of
        ``fence_timeout`` (a park follows at once); else why not (the fenced are let go).
        ``needed``: the idleness the step needs on the others (``None``: ``idle_after``)."""
        deadline = self.now + others.fence_timeout / 2
        refused = await self._fence_others(others, needed)
        if refused is None and self.now >= deadline:
            refused = "fencing took too long"
            await others.unfence_others(self.rt.name)
        return refused

    async def _fence_others(self, others: Others, needed: float | None = None) -> str | None:
        """Every other replica holds new requests for the target (or says why it cannot); then
        the leadership is confirmed, right before the stop."""
        name = self.rt.name
        refused = await others.fence_others(name, needed)
        if refused is None and not await others.confirm_leading():
            refused = "this replica is no longer the leader"
            await others.unfence_others(name)
        return refused
