"""One background task per target owns its phase: it asks :func:`router.scale.scaling.decide` what
to do, performs that step (the only I/O), and waits for the next change or deadline. Each kind of
step is one of :mod:`router.scale.steps`, looked up by its kind; every phase change is an event
applied by the target's :class:`router.scale.machine.Machine`, the one writer of its state. Time
is read through the event loop, so tests can fast-forward it.

Here: the loop (each turn under the target's :class:`router.scale.supervision.Supervisor`) and
the view it decides on. The other replicas, when there are any, come as
:class:`router.scale.coordination.Others`; the target's GPU pool, if any, as ``runtime.pool``."""

from __future__ import annotations

import asyncio
import contextlib
import math

from backends.base import Observation
from router.scale.accounting import ACCOUNTING_INTERVAL
from router.scale.coordination import Others
from router.scale.machine import Event
from router.scale.parts import Parts
from router.scale.scaling import Act, Step, View
from router.scale.state import Phase
from router.scale.steps import STEPS, recover
from router.scale.targets import TargetRuntime


class Lifecycle:
    def __init__(self, runtime: TargetRuntime, others: Others | None = None) -> None:
        self.rt = runtime
        self.others = others
        """Several warmgate replicas (docs/replicas.md): idleness is theirs together, and only
        the leader releases."""
        self._step = "decide"
        """The step of the loop's turn under way: the label of a failure."""
        self.window_change = math.inf
        """Loop time a ``keep_warm`` window begins or ends: the loop looks again then."""
        self.parts = Parts(runtime, others, self.view, self._wait)
        self.machine = self.parts.machine
        self.accounting = self.parts.accounting
        if others is not None:
            others.add_fenceable(runtime.name, self)

    # -- wiring ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self.rt.backend.open(self._observed)
        await self.rt.learned.restore()  # after open: a backend's own store reads its objects
        await self.rt.timeline.open()
        self.rt.rollout.observed(self._obs)
        if self.rt.backend.always_on:
            self.machine.apply(Event.ENDPOINTS, endpoints=self._obs.endpoints)
            return
        self._recover()
        self.rt.supervisor.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"lifecycle:{self.rt.name}"
        )

    async def close(self) -> None:
        task = self.rt.supervisor.task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.rt.learned.close()
        await self.rt.timeline.close()
        self.rt.rollout.close()
        await self.rt.backend.close()
        await self.rt.engine.close()

    @property
    def keda(self) -> bool:
        """KEDA owns the replicas (``mode: keda``): never scale, only wait (docs/keda.md)."""
        return self.parts.release.keda

    @keda.setter
    def keda(self, owned: bool) -> None:
        self.parts.release.keda = owned

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def _obs(self) -> Observation:
        return self.rt.backend.observe()

    def _observed(self, observation: Observation) -> None:
        self.rt.rollout.observed(observation)
        parts = self.parts
        if observation.endpoints and parts.probed_unready:
            parts.probed_unready = False  # ready now: its endpoint is probed at once
            parts.next_probe = self.now
        self.rt.nudge.set()

    def _recover(self) -> None:
        """A backend that is already running (warmgate restarted) is adopted, not restarted."""
        obs = self._obs
        if obs.running and not obs.crashed:  # probed before it counts as ready; the idle
            self.parts.adopted = True  # window then starts fresh: nothing busy stops
            self.parts.starting(Event.ADOPT, "found running")

    # -- fences from the leader of the replicas -------------------------------------------

    def fence(self, until: float, leader: str, needed: float | None = None) -> str | None:
        """Another replica, the leader, is about to release (or park) this target: if this
        replica is idle too, hold new requests from now until the release shows (or ``until``)."""
        return self.parts.fencing.fence(self.view, until, leader, needed)

    def unfence(self, parked: bool = False) -> None:
        """The leader called the release off (serving again), or it parked the target
        (``parked``: parked here too)."""
        self.parts.fencing.unfence("the leader called the release off", parked)

    # -- the loop -------------------------------------------------------------------------

    def view(self) -> View:
        rt, parts = self.rt, self.parts
        if self.others is None:
            idle_since = rt.activity.idle_since(rt.spec.scaling.stream_activity_window)
            may_release = True
        else:  # idle only when every replica is; only the leader releases
            idle_since = self.others.idle_since(rt.name)
            may_release = self.keda or self.others.leading()
        kept_warm, self.window_change = rt.learned.idling.kept_warm(
            rt.learned.predicted_cold_start()
        )
        windows = rt.learned.windows()
        turn, make_room, yield_after = None, None, 0.0
        if rt.pool is not None:  # whose turn it is on the target's GPU pool
            plan = rt.pool.plan()
            turn, make_room = plan.turn(rt.name), plan.displace.get(rt.name)
            yield_after = rt.pool.yield_after
            refused = parts.refused
            if turn is None and refused is not None and self.now < refused.until:
                turn = refused  # the leader's answer: no seat for it in the cluster yet
        return View(
            state=rt.state,
            observation=self._obs,
            scaling=rt.spec.scaling,
            now=self.now,
            held=rt.activity.held,
            wanted=self.now < rt.activity.wanted_until,
            in_flight=rt.activity.in_flight,
            idle_since=idle_since,
            next_probe=parts.next_probe,
            always_on=rt.backend.always_on,
            may_release=may_release,
            release_not_before=parts.fencing.release_not_before,
            fenced_until=parts.fencing.fenced_until,
            last_wanted=rt.activity.last_wanted,
            abandonable=self.others is None and rt.state.since == parts.began,
            idle_after=windows.idle_after,
            park_after=windows.park_after,
            kept_warm=kept_warm,
            can_park=rt.can_park,
            park_asked=rt.park_asked,
            turn=turn,
            make_room=make_room,
            yield_after=yield_after,
            closing=rt.closing,
            release_asked=rt.release_asked,
        )

    def decide(self) -> Step:
        return self.parts.decide(self.view())

    async def _run(self) -> None:
        """The loop, supervised: whatever a turn raises, it goes on after a backoff. The
        accounting is a step apart: its failure never keeps a decision (a release) from being
        made."""
        supervisor = self.rt.supervisor
        while True:
            try:
                await self.accounting.account()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                supervisor.failed("account", exc)
            else:
                supervisor.succeeded("account")
            self._step = "decide"
            try:
                await self._turn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._wait(self.now + supervisor.failed(self._step, exc))
            else:
                supervisor.succeeded("decide", self._step)

    async def _turn(self) -> None:
        step = self.decide()
        if step.act is Act.WAIT:
            await self._wait(min(step.until, self.window_change))
            return
        self._step = step.act.value
        try:
            await self._perform(step)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a backend error: the phase is put right, then counted
            self._step = f"{step.act.value}-recovery"
            await recover(self.parts, step, exc)
            self._step = step.act.value
            raise

    async def _perform(self, step: Step) -> None:
        await STEPS[step.act].perform(self.parts, step)

    async def _wait(self, until: float) -> None:
        nudged = self.rt.nudge
        nudged.clear()
        if self.rt.state.phase in (Phase.READY, Phase.PARKED):
            until = min(until, self.now + ACCOUNTING_INTERVAL)
        timeout = None if math.isinf(until) else max(0.0, until - self.now)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await nudged.wait()
