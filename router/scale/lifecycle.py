"""One background task per target owns its phase: it asks :func:`router.scale.scaling.decide` what
to do, performs that step (the only I/O), and waits for the next change or deadline. Every phase
change is an event applied by the target's :class:`router.scale.machine.Machine`, the one writer
of its state. Time is read through the event loop, so tests can fast-forward it.

The parts it performs with: :mod:`router.scale.release` (a release carried out),
:mod:`router.scale.parking` (the parked tier), :mod:`router.scale.fencing` (with other
replicas), :mod:`router.scale.starts` (a start's stages), :mod:`router.scale.accounting`
(GPU-seconds, the engine's busy signal). The other replicas, when there are any, come as
:class:`router.scale.coordination.Others`; the target's GPU pool, if any, as ``runtime.pool``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math

from backends.base import Observation, StartFailed, load_message, load_progress, parking
from backends.outside import one_line
from router.scale.accounting import ACCOUNTING_INTERVAL, Accounting
from router.scale.coordination import Others
from router.scale.fencing import Fencing
from router.scale.keda_mode import decide_keda, keda_owns_replicas
from router.scale.machine import Event, Machine
from router.scale.parking import Parking
from router.scale.pools import How, Wait
from router.scale.release import Release
from router.scale.scaling import OPERATOR_RELEASE, Act, Step, View, decide, stage_now
from router.scale.starts import StageClock
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")


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
        keda = keda_owns_replicas(runtime.backend)
        self.machine = Machine(
            runtime.name, runtime.cell, runtime.loop, runtime.metrics, runtime.spec.scaling
        )
        self.next_probe = 0.0
        """While starting or waking: loop time of the next readiness probe."""
        self._probed_unready = False
        """The last probe asked a workload not ready yet (``Observation.probe_only``)."""
        self.starts = StageClock(runtime, self.machine)
        self._began: float | None = None
        """``since`` of the start this replica began itself (an adopted one is not)."""
        self.accounting = Accounting(runtime)
        self.fencing = Fencing(runtime, self.machine)
        self.release = Release(runtime, self.machine, self.fencing, others, keda=keda)
        self.parking = Parking(self.release)
        self.adopted = False
        """The workload being probed was found running, not started here: it may be parked."""
        self._refused: Wait | None = None
        """The leader's last refusal of a seat in the target's pool, until it asks again."""
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
        return self.release.keda

    @keda.setter
    def keda(self, owned: bool) -> None:
        self.release.keda = owned

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def _obs(self) -> Observation:
        return self.rt.backend.observe()

    def _observed(self, observation: Observation) -> None:
        self.rt.rollout.observed(observation)
        if observation.endpoints and self._probed_unready:
            self._probed_unready = False  # ready now: its endpoint is probed at once
            self.next_probe = self.now
        self.rt.wake.set()

    def _recover(self) -> None:
        """A backend that is already running (warmgate restarted) is adopted, not restarted."""
        obs = self._obs
        if obs.running and not obs.crashed:  # probed before it counts as ready; the idle
            self.adopted = True  # window then starts fresh: nothing busy stops
            self._starting(Event.ADOPT, "found running")

    # -- fences from the leader of the replicas -------------------------------------------

    def fence(self, until: float, leader: str, needed: float | None = None) -> str | None:
        """Another replica, the leader, is about to release (or park) this target: if this
        replica is idle too, hold new requests from now until the release shows (or ``until``)."""
        return self.fencing.fence(self.view, until, leader, needed)

    def unfence(self, parked: bool = False) -> None:
        """The leader called the release off (serving again), or it parked the target
        (``parked``: parked here too)."""
        self.fencing.unfence("the leader called the release off", parked)

    # -- the loop -------------------------------------------------------------------------

    def view(self) -> View:
        rt = self.rt
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
            refused = self._refused
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
            next_probe=self.next_probe,
            always_on=rt.backend.always_on,
            may_release=may_release,
            release_not_before=self.fencing.release_not_before,
            fenced_until=self.fencing.fenced_until,
            last_wanted=rt.activity.last_wanted,
            abandonable=self.others is None and rt.state.since == self._began,
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
        return (decide_keda if self.keda else decide)(self.view())

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
            state = self.rt.state
            if state.phase is Phase.STARTING:
                self.release.fail(f"{step.act.value} failed: {one_line(exc)}")
                with contextlib.suppress(Exception):
                    await self.release.reap()  # never hold the GPU in a backoff
            elif state.phase is Phase.DRAINING and not self.fencing.fenced:
                await self.release.failed(exc)  # never left holding requests for a stop
                self.next_probe = self.now
            self._step = step.act.value
            raise

    async def _wait(self, until: float) -> None:
        wake = self.rt.wake
        wake.clear()
        if self.rt.state.phase in (Phase.READY, Phase.PARKED):
            until = min(until, self.now + ACCOUNTING_INTERVAL)
        timeout = None if math.isinf(until) else max(0.0, until - self.now)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await wake.wait()

    async def _perform(self, step: Step) -> None:
        rt, machine = self.rt, self.machine
        if step.act in (Act.START, Act.WAKE) and not await self._seat():
            return  # decided again: it waits for a seat, saying why
        if step.act is Act.START:
            self.adopted = False
            self._starting(Event.START, step.reason)
            self._began = rt.state.since
            rt.metrics.cold_starts.labels(rt.name).inc()
            if not self.keda:  # KEDA adds the replica: the held request made the scaler say active
                await rt.backend.scale_up()
        elif step.act is Act.PROBE:
            try:
                await self._probe()
            except StartFailed as exc:  # the engine says why: no retry until the backoff
                await self._start_failed(str(exc))
        elif step.act is Act.RESTART:
            await self._restart(step)
        elif step.act is Act.FAIL:
            self.release.fail(step.reason, told=step.told)
            await self.release.reap()
        elif step.act is Act.LOST:
            released = self.fencing.released()  # fenced: the leader released it
            machine.apply(Event.LOST, released or step.reason)
            if released is not None:
                await self.release.close_streams()
            elif self.others is None:  # one replica: reap what is left (a crashed child's group)
                await self.release.reap()
        elif step.act is Act.ADOPT:
            self.adopted = True
            self._starting(Event.ADOPT, step.reason)
        elif step.act is Act.STAGE:
            self.starts.publish(*stage_now(self.view()))
        elif step.act is Act.ABANDON:
            await self.release.abandon(step.reason)
        elif step.act is Act.REFRESH:
            self._refresh()
        elif step.act is Act.RESUME:
            self.fencing.unfence(step.reason)
        elif step.act is Act.WAKE:
            await self.parking.wake(step.reason)
            self.next_probe = self.now
        elif step.act is Act.STOP:
            await self.release.stop_instead(step.reason)
        elif step.act is Act.QUEUE:
            await self._queue(step)
        elif await self._last_look(step):  # DRAIN, YIELD, PARK: decided again after it
            await self._stop_or_park(step)

    async def _seat(self) -> bool:
        """With several replicas, a start or wake in a GPU pool takes a seat the leader grants
        (counted once for the cluster); refused, the answer is an input of the next decision,
        until the others are read again."""
        rt, others = self.rt, self.others
        if rt.pool is None or others is None or self.keda:
            return True
        refused = await others.grant(rt.pool.name, rt.name)
        self._refused = (
            None if refused is None else Wait(refused, until=self.now + others.poll_interval)
        )
        return refused is None

    async def _last_look(self, step: Step) -> bool:
        """Before a release or a park, the engine's own queue is looked at once more (a render
        may have been queued since the last poll) while the target still serves: a request that
        arrives meanwhile is served, and counts. A release shows ``draining`` meanwhile (a
        parked target is held from the start: it serves nothing, and has no queue to look at).
        Then the step is decided again, over the phase it began in; ``False``: activity came
        meanwhile (a drain goes back to that phase), and the next turn decides anew."""
        machine = self.machine
        if step.act is not Act.PARK:
            machine.apply(Event.DRAIN, step.reason)
        state = self.rt.state
        if not state.stopping and state.endpoints:
            await self.accounting.check_busy(state.endpoints[0])
        view = self.view()
        back_to = self.rt.state.back_to
        if back_to is not None:  # decided again over the phase it began in
            view = dataclasses.replace(view, state=back_to)
        if step.room_for:  # the pool chose it; whether it is still idle enough is asked again
            how: How = "park" if step.act is Act.PARK else "stop"
            view = dataclasses.replace(view, make_room=(step.room_for, how))
        again = (decide_keda if self.keda else decide)(view)
        if again.act is step.act and again.room_for == step.room_for:
            return True
        if step.act is not Act.PARK:
            machine.apply(Event.PUT_OFF, "drain cancelled")
        return False

    async def _stop_or_park(self, step: Step) -> None:
        rt = self.rt
        if step.act is Act.PARK:
            await self.parking.park(step.reason, step.idle, displaced=bool(step.room_for))
            return
        if step.reason == OPERATOR_RELEASE:  # the gap it ends was no person's: nothing learned
            rt.release_asked = False
            rt.learned.idling.forget_gap(
                rt.activity.idle_since(rt.spec.scaling.stream_activity_window)
            )
        needed = step.idle if step.act is Act.YIELD else None
        await self.release.run(step.reason, needed)
        if step.act is Act.YIELD and rt.pool is not None and rt.state.phase is not Phase.READY:
            rt.metrics.pool_displacements.labels(rt.pool.name, rt.name, "stop").inc()

    async def _restart(self, step: Step) -> None:
        """The workload exited before it was ever ready, with requests held: started again at
        once, on the same start's clock (``cold_start_timeout`` and the learned ETA count from
        the first try)."""
        rt = self.rt
        log.warning("%s: %s", rt.name, step.reason)
        self.next_probe = self.now
        self.machine.apply(Event.RESTART, step.reason)
        if not self.keda:
            await self.release.reap()  # what is left of the child's group
            await rt.backend.scale_up()

    async def _start_failed(self, reason: str) -> None:
        """The engine's readiness answer says its start (or wake) failed and will not succeed
        as it is: failed at once with its reason, rather than at ``cold_start_timeout``."""
        if self.rt.state.phase is Phase.PARKED:
            await self.release.stop_instead(f"the wake failed ({reason})")
            return
        self.release.fail(reason, engine_said=True)
        await self.release.reap()

    def _starting(self, event: Event, reason: str) -> None:
        """To ``starting`` (a start, one adopted, a pod to wait for), probed from now on."""
        self.next_probe = self.now
        self.machine.apply(event, reason)

    def _refresh(self) -> None:
        """Ready endpoints changed: the new set is published at once (a request never goes to
        a pod that is gone once its watch event arrived); none left: back to starting."""
        rt, endpoints = self.rt, self._obs.endpoints
        if endpoints:
            log.info("%s: ready endpoints now %s", rt.name, ", ".join(endpoints))
            self.machine.apply(Event.ENDPOINTS, endpoints=endpoints)
        else:
            reason = "no ready endpoint left; waiting for a replacement"
            self._starting(Event.NO_ENDPOINT, reason)

    async def _queue(self, step: Step) -> None:
        """A start or wake waits for room in the target's GPU pool: say what for, and look
        again when a resident may be displaced (or anything in the pool changes)."""
        rt = self.rt
        state = rt.state
        if state.waiting_for != step.reason:
            if step.reason and not state.waiting_for and rt.pool is not None:
                rt.metrics.pool_waits.labels(rt.pool.name, rt.name).inc()
                log.info("%s: %s", rt.name, step.reason)
            self.machine.apply(Event.QUEUE, step.reason)
        if step.reason:
            await self._wait(min(step.until, self.now + ACCOUNTING_INTERVAL))
        else:
            await self._wait(math.inf)

    async def _probe(self) -> None:
        rt, obs = self.rt, self._obs
        endpoint = (obs.endpoints or obs.probe_only)[0]  # not ready yet: for its words only
        self._probed_unready = not obs.endpoints
        if rt.state.phase is Phase.PARKED:  # waking
            if await self.parking.probe(endpoint) and rt.state.waking:
                self.parking.woke()
                self.accounting.restart()
            else:
                self.next_probe = self.now + rt.spec.readiness.interval
            return
        ready = await rt.engine.probe_ready(endpoint)
        if not (ready and rt.state.phase is Phase.STARTING and self._obs.endpoints):
            said = load_message(rt.engine, endpoint)
            self.starts.progressed(load_progress(rt.engine, endpoint), said)
            self.next_probe = self.now + rt.spec.readiness.interval
            return
        engine = parking(rt.engine) if self.adopted else None
        if engine is not None and await engine.is_parked(endpoint) is True:  # found parked
            self.machine.apply(Event.FOUND_PARKED, "found parked (its engine says so)")
            return
        began = rt.state.since
        rt.metrics.cold_start_seconds.labels(rt.name).observe(self.now - began)
        stages = self.starts.so_far()  # the time no GPU was free is not what a start takes
        rt.learned.cold_start(self.now - began - self.starts.waited_for_gpu(), stages or None)
        rt.activity.wanted_until = float("-inf")
        rt.activity.last_request = self.now  # a fresh start gets a full idle window
        self.accounting.restart()
        self.machine.apply(
            Event.READY,
            f"ready after {self.now - began:.1f}s",
            endpoints=self._obs.endpoints,
        )
