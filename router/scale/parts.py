"""What a target's steps (:mod:`router.scale.steps`) perform with: its machine (every event
applied), :mod:`router.scale.release` (the leader's stop, what is left reaped, the streams
closed), :mod:`router.scale.parking` (the engine's park and wake), :mod:`router.scale.fencing`
(with other replicas), :mod:`router.scale.starts` (a start's stages),
:mod:`router.scale.accounting` (GPU-seconds, the engine's busy signal), and the loop's probe
clock that the steps move and the view reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from router.scale.accounting import Accounting
from router.scale.coordination import Others
from router.scale.fencing import Fencing
from router.scale.keda_mode import decide_keda, keda_owns_replicas
from router.scale.machine import Event, Machine
from router.scale.parking import Parking
from router.scale.pools import Wait
from router.scale.release import Release
from router.scale.scaling import Step, View, decide
from router.scale.starts import StageClock
from router.scale.targets import TargetRuntime


class Parts:
    """What a target's steps perform with, and the loop's probe clock they move; the view and
    the wait are the lifecycle's."""

    def __init__(
        self,
        runtime: TargetRuntime,
        others: Others | None,
        view: Callable[[], View],
        wait: Callable[[float], Awaitable[None]],
    ) -> None:
        self.rt = runtime
        self.others = others
        self.view = view
        self.wait = wait
        """Until this loop time, or until something changes."""
        self.machine = Machine(
            runtime.name, runtime.cell, runtime.loop, runtime.metrics, runtime.spec.scaling
        )
        self.starts = StageClock(runtime, self.machine)
        self.accounting = Accounting(runtime)
        self.fencing = Fencing(runtime, self.machine)
        keda = keda_owns_replicas(runtime.backend)
        self.release = Release(runtime, self.fencing, others, keda=keda)
        self.parking = Parking(runtime)
        self.next_probe = 0.0
        """While starting or waking: loop time of the next readiness probe."""
        self.probed_unready = False
        """The last probe asked a workload not ready yet (``Observation.probe_only``)."""
        self.began: float | None = None
        """``since`` of the start this replica began itself (an adopted one is not)."""
        self.adopted = False
        """The workload being probed was found running, not started here: it may be parked."""
        self.refused: Wait | None = None
        """The leader's last refusal of a seat in the target's pool, until it asks again."""

    @property
    def keda(self) -> bool:
        return self.release.keda

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    def decide(self, view: View) -> Step:
        return (decide_keda if self.keda else decide)(view)

    def starting(self, event: Event, reason: str) -> None:
        """To ``starting`` (a start, one adopted, a pod to wait for), probed from now on."""
        self.next_probe = self.now
        self.machine.apply(event, reason)

    async def seat(self) -> bool:
        """With several replicas, a start or wake in a GPU pool takes a seat the leader grants
        (counted once for the cluster); refused, the answer is an input of the next decision,
        until the others are read again."""
        rt, others = self.rt, self.others
        if rt.pool is None or others is None or self.keda:
            return True
        refused = await others.grant(rt.pool.name, rt.name)
        self.refused = (
            None if refused is None else Wait(refused, until=self.now + others.poll_interval)
        )
        return refused is None
