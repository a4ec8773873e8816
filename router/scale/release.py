"""A release carried out: the stop committed (``draining``), the GPU released (by this replica
alone, by the leader with the others fenced, or, when KEDA owns the replicas, left to KEDA) and
the phase made ``cold``; what is left of a failed start or a lost workload; a start nobody waits
for any more; and a park or wake that failed, stopped instead. The decision to release (and its
last look) is :func:`router.scale.scaling.decide`'s; every phase change is the machine's."""

from __future__ import annotations

import contextlib
import logging

from router.http.websocket import GOING_AWAY
from router.scale.coordination import Others
from router.scale.fencing import Fencing
from router.scale.machine import Event, Machine
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


class Release:
    def __init__(
        self,
        runtime: TargetRuntime,
        machine: Machine,
        fencing: Fencing,
        others: Others | None,
        *,
        keda: bool,
    ) -> None:
        self.rt = runtime
        self.machine = machine
        self.fencing = fencing
        self.others = others
        self.keda = keda

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    async def run(self, reason: str, idle_needed: float | None = None) -> None:
        """Decided, and decided again after the last look: the stop is committed (from here new
        requests are held for the next start, and streams, idle tabs, are closed), and made.
        ``idle_needed``: the idleness the others must show (the pool's ``yield_after`` when it
        makes room); ``None``: ``idle_after``."""
        rt, machine = self.rt, self.machine
        machine.apply(Event.COMMIT, reason)
        if self.others is not None and not self.keda:
            await self._as_leader(self.others, reason, idle_needed)
            return
        await self.close_streams()
        if self.keda:  # the scaler now says inactive; KEDA's scale-down ends this (-> cold)
            if self.others is None or self.others.leading():  # counted once
                rt.metrics.idle_releases.labels(rt.name).inc()
            return
        await rt.backend.scale_down()
        rt.metrics.idle_releases.labels(rt.name).inc()
        machine.apply(Event.RELEASED, reason)

    async def _as_leader(self, others: Others, reason: str, needed: float | None) -> None:
        """The leader's release: fence the other replicas, confirm the leadership, stop, all
        before the fences could run out (half of ``fence_timeout``); or put it off."""
        rt, machine, fencing = self.rt, self.machine, self.fencing
        deadline = self.now + others.fence_timeout / 2
        refused = await fencing.fence_all(others, needed)
        if refused is None:
            await rt.backend.scale_down(deadline)
            if rt.backend.observe().running:  # the stop could not be stored in time
                await others.unfence_others(rt.name)
                refused = "the stop could not be made in time"
        if refused is not None:
            log.info("%s: release put off: %s", rt.name, refused)
            fencing.put_off(others)
            machine.apply(Event.PUT_OFF, f"release put off: {refused}")
            return
        rt.metrics.idle_releases.labels(rt.name).inc()
        machine.apply(Event.RELEASED, reason)
        await self.close_streams()

    async def failed(self, exc: Exception) -> None:
        """The release could not be made: serving again once the workload is probed ready (the
        others, fenced, are let go)."""
        self.machine.apply(Event.RELEASE_FAILED, f"release failed: {exc}")
        if self.others is not None:
            with contextlib.suppress(Exception):
                await self.others.unfence_others(self.rt.name)

    async def reap(self) -> None:
        """After a failed start or a lost workload. With several replicas, never: the workload
        may serve another replica; a failed target whose workload runs on is released by
        idleness like a ready one (``decide``), fenced by the leader."""
        if self.keda:  # KEDA scales down once the scaler says inactive (and cooldown passed)
            return
        if self.others is not None:
            log.info("%s: left running: a stop is the leader's, once all are idle", self.rt.name)
            return
        await self.rt.backend.scale_down()

    async def abandon(self, reason: str) -> None:
        """A start this replica alone began and nobody waits for any more: stopped (a pod left
        Pending must not take a GPU later with nobody there); phase -> cold, and the next
        request starts it again. KEDA scales it down once the scaler says inactive."""
        rt = self.rt
        log.warning("%s: start abandoned (%s)", rt.name, reason)
        rt.activity.wanted_until = float("-inf")
        if not self.keda:
            await rt.backend.scale_down()
        self.machine.apply(Event.ABANDON, f"start abandoned: {reason}")

    def fail(self, reason: str, *, engine_said: bool = False, told: str = "") -> None:
        """A failed cold start (or a park or wake this replica may not stop): ``failed``, with
        the backoff before the next try. ``engine_said``: the reason is the engine's own
        answer, which held requests are told too; ``told``: else what they are told (the
        workload's own last error)."""
        state = self.machine.apply(Event.FAIL, reason, told=reason if engine_said else told)
        wait = state.retry_at - self.now
        log.warning("%s: cold start failed (%s); next try in %.0fs", self.rt.name, reason, wait)

    async def stop_instead(self, why: str) -> None:
        """A park or wake that failed: the target is stopped (the next request starts it cold);
        where this replica may not stop it (KEDA owns it, or another replica leads), it is
        marked failed (``fail``), and released by idleness like any failed start."""
        rt, machine = self.rt, self.machine
        log.warning("%s: %s; stopping it instead", rt.name, why)
        if self.keda or (self.others is not None and not self.others.leading()):
            self.fail(why)
            return
        machine.apply(Event.STOP, why)
        await self.close_streams()
        await rt.backend.scale_down()
        machine.apply(Event.RELEASED, f"stopped: {why}")

    async def close_streams(self) -> None:
        for close in list(self.rt.activity.streams.values()):
            with contextlib.suppress(Exception):
                await close(GOING_AWAY, "idle: the GPU is released")
