"""GPU-seconds of one target while it is ready, split busy / idle, and parked (its process holds
a GPU context but no weights), and the engine's own busy signal (a render in its queue with no
HTTP traffic), polled on the way; the poll's queue depth goes to the target's
:class:`router.scale.engine_queue.EngineQueue`."""

from __future__ import annotations

import logging

from backends.base import queue_reporter
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")

ACCOUNTING_INTERVAL = 1.0
"""While ready, GPU-seconds are accounted (and busy engines polled) at least this often."""


class Accounting:
    def __init__(self, runtime: TargetRuntime) -> None:
        self.rt = runtime
        self._accounted_at = runtime.loop.time()
        self._next_busy_poll = 0.0
        self._reporter = queue_reporter(runtime.engine)
        gpu_seconds = runtime.metrics.gpu_seconds
        self._seconds = {s: gpu_seconds.labels(runtime.name, s) for s in ("busy", "idle", "parked")}
        """The target's ``warmgate_gpu_seconds_total`` children, labelled once."""

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    def restart(self) -> None:
        """Ready from now: nothing before counts (the engine's queue is read afresh)."""
        self._accounted_at = self.now
        self.rt.queue.restart()

    @property
    def busy_window(self) -> float:
        """A busy answer keeps the target active until the next poll has surely happened."""
        return self.rt.spec.scaling.busy_poll + ACCOUNTING_INTERVAL

    async def check_busy(self, endpoint: str) -> None:
        """Ask the engine; busy keeps the target active for :attr:`busy_window`. The depth of
        its queue the poll read (where it tells one) goes to ``queue``."""
        try:
            busy = await self.rt.engine.busy(endpoint)
        except Exception:  # an engine's probe must never stop its lifecycle
            log.exception("%s: busy check failed", self.rt.name)
            busy = False
        reporter = self._reporter
        depth = None if reporter is None else reporter.queue_depth(endpoint)
        self.rt.queue.heard(depth, self.now)
        if busy:
            self.rt.activity.busy_until = self.now + self.busy_window

    async def account(self) -> None:
        """GPU-seconds while ready, split by activity; polls the engine's busy signal."""
        rt, now = self.rt, self.now
        rt.timeline.sample(rt.state)  # busy or idle: what a change of state does not tell
        elapsed, self._accounted_at = now - self._accounted_at, now
        if rt.state.phase is Phase.PARKED and not rt.state.waking:
            self._seconds["parked"].inc(max(0.0, elapsed))
            return
        if rt.state.phase is not Phase.READY:
            return
        if now >= self._next_busy_poll and rt.state.endpoints:
            self._next_busy_poll = now + rt.spec.scaling.busy_poll
            await self.check_busy(rt.state.endpoints[0])
        idle_since = rt.activity.idle_since(rt.spec.scaling.stream_activity_window)
        elapsed = max(0.0, elapsed)
        idle = 0.0 if idle_since is None else min(elapsed, max(0.0, now - idle_since))
        self._seconds["busy"].inc(elapsed - idle)
        self._seconds["idle"].inc(idle)
