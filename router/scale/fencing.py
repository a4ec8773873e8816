"""Fences between warmgate replicas, one target's side of them (docs/replicas.md).

Fenced: the leader of the replicas is about to release the target, and this replica, idle too,
holds new requests from then until the release shows (the workload gone), the leader calls it
off, or the fence runs out. Whether to agree is decided by
:func:`router.scale.scaling.answer_fence`; the phase changes are the machine's. Fencing: this
replica leads and releases the target itself, with every other one fenced first, and the stop
stored before the fences could run out."""

from __future__ import annotations

import math
from collections.abc import Callable

from router.scale.coordination import Others
from router.scale.machine import Event, Machine
from router.scale.scaling import Act, View, answer_fence
from router.scale.state import Phase
from router.scale.targets import TargetRuntime


class Fencing:
    def __init__(self, runtime: TargetRuntime, machine: Machine) -> None:
        self.rt = runtime
        self.machine = machine
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

    def fence(
        self, view: Callable[[], View], until: float, leader: str, needed: float | None
    ) -> str | None:
        """The leader's ask, answered by :func:`answer_fence` over this replica's view: ``None``
        when agreed (held from now until the release shows, or ``until``), else why not."""
        step = answer_fence(view(), needed)
        if step.act is not Act.FENCE:
            if not step.reason and self.fenced:  # already stopping for the leader
                self.fenced_until = max(self.fenced_until, until)
            return step.reason or None
        self.fenced_until, self.fenced_by = until, leader
        self.machine.apply(Event.FENCE, f"{leader} is releasing it ({step.reason})")
        self.rt.nudge.set()
        return None

    def unfence(self, reason: str, parked: bool = False) -> None:
        """The fence ends: serving again, or, when the leader parked the target (``parked``),
        parked here too (the next request wakes it)."""
        if not self.fenced:
            return
        self.fenced_until = -math.inf
        rt = self.rt
        if rt.state.phase is Phase.DRAINING and rt.state.stopping:
            endpoints = rt.backend.observe().endpoints
            if not endpoints:  # the pod went meanwhile: wait for one, probed like any start
                self.machine.apply(Event.NO_ENDPOINT, reason)
            elif parked:
                reason = f"parked by {self.fenced_by}"
                self.machine.apply(Event.UNFENCE_PARKED, reason, endpoints=endpoints)
            else:
                self.machine.apply(Event.UNFENCE, reason, endpoints=endpoints)
        rt.nudge.set()

    def released(self) -> str | None:
        """The workload is gone: if this replica was fenced, the leader released it (the reason
        to say so); ``None`` when it was not fenced."""
        if not self.fenced:
            return None
        self.fenced_until = -math.inf
        return f"released by {self.fenced_by}"

    # -- fencing the others, as the leader ------------------------------------------------

    def put_off(self, others: Others) -> None:
        """A release or park put off: not tried again before the others are read again."""
        self.release_not_before = self.now + others.poll_interval

    async def fence_all(self, others: Others, needed: float | None = None) -> str | None:
        """Every other replica fenced and the leadership confirmed, within half of
        ``fence_timeout`` (a stop or park follows at once); else why not (the fenced are let
        go). ``needed``: the idleness the step needs on the others (``None``: ``idle_after``)."""
        name = self.rt.name
        deadline = self.now + others.fence_timeout / 2
        refused = await others.fence_others(name, needed)
        if refused is None and not await others.confirm_leading():
            refused = "this replica is no longer the leader"
            await others.unfence_others(name)
        if refused is None and self.now >= deadline:
            refused = "fencing took too long"
            await others.unfence_others(name)
        return refused
