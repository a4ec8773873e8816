"""What a release needs done outside the target's state: the GPU released by the leader with
the other replicas fenced first, what is left of a failed start or a lost workload reaped, the
others let go, the streams closed. The decision to release (and its last look) is
:func:`router.scale.scaling.decide`'s, the release step (its events, its counts) is
:mod:`router.scale.steps`', every phase change the machine's."""

from __future__ import annotations

import contextlib
import logging

from router.scale.activity import StreamEnd
from router.scale.coordination import Others
from router.scale.fencing import Fencing
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


class Release:
    def __init__(
        self, runtime: TargetRuntime, fencing: Fencing, others: Others | None, *, keda: bool
    ) -> None:
        self.rt = runtime
        self.fencing = fencing
        self.others = others
        self.keda = keda

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def fences(self) -> bool:
        """A release or park here is the leader's, with the other replicas fenced first."""
        return self.others is not None and not self.keda

    async def as_leader(self, needed: float | None) -> str | None:
        """The leader's stop: fence the other replicas, confirm the leadership, stop, all before
        the fences could run out (half of ``fence_timeout``); ``None`` once made, else why it
        is put off (the others let go, and not tried again before they are read again)."""
        rt, fencing, others = self.rt, self.fencing, self.others
        assert others is not None
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
        return refused

    async def let_go(self) -> None:
        """A release that failed: the others, fenced, are let go."""
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

    async def close_streams(self) -> None:
        await self.rt.activity.close_streams(StreamEnd.RELEASED)
