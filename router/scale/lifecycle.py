"""One background task per target owns its phase: it asks :func:`router.scale.scaling.decide` what
to do, performs that step (the only I/O), publishes the new snapshot, and waits for the next change
or deadline. Time is read through the event loop, so tests can fast-forward it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math

from backends.base import Observation
from router.cluster.keda_state import decide_keda, keda_owns_replicas
from router.cluster.replicas import Replicas
from router.scale.scaling import SLACK, Act, Step, View, backoff, decide
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.lifecycle")

ACCOUNTING_INTERVAL = 1.0
"""While ready, GPU-seconds are accounted (and busy engines polled) at least this often."""


class Lifecycle:
    def __init__(self, runtime: TargetRuntime, replicas: Replicas | None = None) -> None:
        self.rt = runtime
        self.replicas = replicas
        """Several warmgate replicas (docs/replicas.md): idleness is theirs together, and only
        the leader releases."""
        self._release_not_before = -math.inf
        self._fenced_until = -math.inf
        self._fenced_by = ""
        self._task: asyncio.Task[None] | None = None
        self._next_probe = 0.0
        self._accounted_at = runtime.loop.time()
        self._next_busy_poll = 0.0
        self.keda = keda_owns_replicas(runtime.spec)
        """KEDA owns the replicas (``mode: keda``): never scale, only wait (docs/keda.md)."""
        self._phase_gauges = {
            phase: runtime.metrics.target_phase.labels(runtime.name, phase.value) for phase in Phase
        }
        runtime.cell.subscribe(self._on_state)
        self._on_state(runtime.state, runtime.state)
        if replicas is not None:
            replicas.fenceables[runtime.name] = self

    # -- wiring ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self.rt.backend.open(self._observed)
        if self.rt.backend.always_on:
            self._publish(
                self.rt.state.with_phase(Phase.READY, self.now, endpoints=self._obs.endpoints)
            )
            return
        await self._recover()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"lifecycle:{self.rt.name}"
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.rt.backend.close()
        await self.rt.engine.close()

    @property
    def now(self) -> float:
        return self.rt.loop.time()

    @property
    def _obs(self) -> Observation:
        return self.rt.backend.observe()

    def _observed(self, observation: Observation) -> None:
        self.rt.wake.set()

    def _on_state(self, old: TargetState, new: TargetState) -> None:
        if old.phase is not new.phase or old is new:
            for phase, gauge in self._phase_gauges.items():
                gauge.set(1 if phase is new.phase else 0)
        if old.phase is not new.phase:
            log.info(
                "%s: %s -> %s (%s)", self.rt.name, old.phase.value, new.phase.value, new.reason
            )

    def _publish(self, state: TargetState) -> None:
        self.rt.cell.replace(state)

    async def _recover(self) -> None:
        """A backend that is already running (warmgate restarted) is adopted, not restarted."""
        obs = self._obs
        if obs.running and not obs.crashed:  # probed before it counts as ready; the idle
            self._next_probe = self.now  # window then starts fresh, so nothing busy is stopped
            self._publish(
                self.rt.state.with_phase(Phase.STARTING, self.now, reason="found running")
            )

    # -- the loop -------------------------------------------------------------------------

    def view(self) -> View:
        rt = self.rt
        if self.replicas is None:
            idle_since = rt.activity.idle_since(rt.spec.scaling.stream_activity_window)
            may_release = True
        else:  # idle only when every replica is; only the leader releases
            idle_since = self.replicas.combined(rt.name).idle_since
            may_release = self.keda or self.replicas.leading()
        return View(
            state=rt.state,
            observation=self._obs,
            scaling=rt.spec.scaling,
            now=self.now,
            held=rt.activity.held,
            wanted=self.now < rt.activity.wanted_until,
            in_flight=rt.activity.in_flight,
            idle_since=idle_since,
            next_probe=self._next_probe,
            always_on=rt.backend.always_on,
            may_release=may_release,
            release_not_before=self._release_not_before,
            fenced_until=self._fenced_until,
        )

    async def _run(self) -> None:
        while True:
            await self._account()
            step = (decide_keda if self.keda else decide)(self.view())
            if step.act is Act.WAIT:
                await self._wait(step.until)
                continue
            try:
                await self._perform(step)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a backend error must never end the loop
                log.exception("%s: %s failed", self.rt.name, step.act.value)
                state = self.rt.state
                if state.phase is Phase.STARTING:
                    self._fail(f"{step.act.value} failed: {exc}")
                    with contextlib.suppress(Exception):
                        await self._scale_down()  # never hold the GPU through a backoff
                elif state.phase is Phase.DRAINING and math.isinf(self._fenced_until):
                    await self._drain_failed(exc)  # never left holding requests for a stop
                else:
                    await self._wait(self.now + 1.0)

    async def _wait(self, until: float) -> None:
        wake = self.rt.wake
        wake.clear()
        if self.rt.state.phase is Phase.READY:
            until = min(until, self.now + ACCOUNTING_INTERVAL)
        timeout = None if math.isinf(until) else max(0.0, until - self.now)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await wake.wait()

    async def _perform(self, step: Step) -> None:
        rt, now = self.rt, self.now
        if step.act is Act.START:
            self._publish(
                rt.state.with_phase(Phase.STARTING, now, reason=step.reason, endpoints=())
            )
            rt.metrics.cold_starts.labels(rt.name).inc()
            self._next_probe = now
            if not self.keda:  # KEDA adds the replica: the held request made the scaler say active
                await rt.backend.scale_up()
        elif step.act is Act.PROBE:
            endpoint = self._obs.endpoints[0]
            ready = await rt.engine.probe_ready(endpoint)
            if ready and rt.state.phase is Phase.STARTING:
                began = rt.state.since
                rt.metrics.cold_start_seconds.labels(rt.name).observe(self.now - began)
                rt.record_cold_start(self.now - began)
                rt.activity.wanted_until = float("-inf")
                rt.activity.last_request = self.now  # a fresh start gets a full idle window
                self._accounted_at = self.now
                self._publish(
                    rt.state.with_phase(
                        Phase.READY,
                        self.now,
                        endpoints=self._obs.endpoints,
                        reason=f"ready after {self.now - began:.1f}s",
                        failures=0,
                    )
                )
            else:
                self._next_probe = self.now + rt.spec.readiness.interval
        elif step.act is Act.FAIL:
            self._fail(step.reason)
            await self._scale_down()
        elif step.act is Act.LOST:
            if not math.isinf(self._fenced_until):  # the leader released it
                self._fenced_until = -math.inf
                reason = f"released by {self._fenced_by}"
                self._publish(rt.state.with_phase(Phase.COLD, now, endpoints=(), reason=reason))
                await self._close_streams()
                return
            self._publish(rt.state.with_phase(Phase.COLD, now, endpoints=(), reason=step.reason))
            if self.replicas is None:  # one replica: reap what is left (a crashed child's group)
                await self._scale_down()
        elif step.act is Act.DRAIN:
            await self._drain(step.reason)
        elif step.act is Act.ADOPT:
            self._next_probe = now
            self._publish(rt.state.with_phase(Phase.STARTING, now, reason=step.reason))
        elif step.act is Act.REFRESH:
            self._refresh()
        elif step.act is Act.RESUME:
            self.unfence(step.reason)

    def _refresh(self) -> None:
        """Ready endpoints changed: the new set is published at once (a request never goes to
        a pod that is gone once its watch event arrived); none left: back to starting."""
        rt, endpoints = self.rt, self._obs.endpoints
        if endpoints:
            log.info("%s: ready endpoints now %s", rt.name, ", ".join(endpoints))
            self._publish(dataclasses.replace(rt.state, endpoints=endpoints))
        else:
            self._next_probe = self.now
            reason = "no ready endpoint left; waiting for a replacement"
            self._publish(
                rt.state.with_phase(Phase.STARTING, self.now, endpoints=(), reason=reason)
            )

    def _fail(self, reason: str) -> None:
        rt = self.rt
        failures = rt.state.failures + 1
        wait = backoff(failures, rt.spec.scaling)
        log.warning("%s: cold start failed (%s); next try in %.0fs", rt.name, reason, wait)
        self._publish(
            rt.state.with_phase(
                Phase.FAILED,
                self.now,
                endpoints=(),
                reason=reason,
                failures=failures,
                retry_at=self.now + wait,
            )
        )

    async def _drain(self, reason: str) -> None:
        rt = self.rt
        before = rt.state
        self._publish(rt.state.with_phase(Phase.DRAINING, self.now, reason=reason, stopping=False))
        # A last look at the engine's own queue (a render may have been queued since the last
        # poll). The workload is still up meanwhile: a request that arrives is served at once
        # and cancels the drain.
        endpoints = rt.state.endpoints
        if endpoints and await self._engine_busy(endpoints[0]):
            rt.activity.busy_until = self.now + self._busy_window
        # Decide again, synchronously with setting ``stopping``: after this point new requests
        # are held for the next start, and streams (idle tabs) are closed.
        activity = rt.activity
        window = rt.spec.scaling.stream_activity_window
        idle_since = activity.idle_since(window)
        if (
            activity.held > 0
            or idle_since is None
            or self.now - idle_since < rt.spec.scaling.idle_after
        ):
            self._back_to(before, "drain cancelled")
            return
        self._publish(rt.state.with_phase(Phase.DRAINING, self.now, reason=reason, stopping=True))
        if self.replicas is not None and not self.keda:
            await self._release_with_others(before, reason)
            return
        await self._close_streams()
        if self.keda:  # the scaler now says inactive; KEDA's scale-down ends this (-> cold)
            if self.replicas is None or self.replicas.leading():  # counted once
                rt.metrics.idle_releases.labels(rt.name).inc()
            return
        await rt.backend.scale_down()
        rt.metrics.idle_releases.labels(rt.name).inc()
        self._publish(rt.state.with_phase(Phase.COLD, self.now, endpoints=(), reason=reason))

    async def _drain_failed(self, exc: Exception) -> None:
        rt = self.rt
        self._next_probe = self.now
        reason = f"release failed: {exc}"
        self._publish(rt.state.with_phase(Phase.STARTING, self.now, reason=reason, stopping=False))
        if self.replicas is not None:
            with contextlib.suppress(Exception):
                await self.replicas.unfence_others(rt.name)
        await self._wait(self.now + 1.0)

    def _back_to(self, before: TargetState, reason: str) -> None:
        """A drain that does not happen: the phase it started from (ready, or failed with the
        workload left running), serving again."""
        rt = self.rt
        if before.phase is Phase.READY:
            self._publish(rt.state.with_phase(Phase.READY, self.now, reason=reason, stopping=False))
        else:
            self._publish(dataclasses.replace(before, reason=reason))

    async def _release_with_others(self, before: TargetState, reason: str) -> None:
        """The leader's release: fence the other replicas, confirm the leadership, stop, all
        before the fences could run out (half of ``fence_timeout``); or put it off."""
        rt, replicas = self.rt, self.replicas
        assert replicas is not None
        deadline = self.now + replicas.spec.fence_timeout / 2
        refused = await self._fence_others()
        if refused is None and self.now >= deadline:
            refused = "fencing took too long"
            await replicas.unfence_others(rt.name)
        if refused:
            log.info("%s: release put off: %s", rt.name, refused)
            self._release_not_before = self.now + replicas.spec.poll_interval
            self._back_to(before, f"release put off: {refused}")
            return
        await rt.backend.scale_down(deadline)
        if rt.backend.observe().running:  # the stop could not be stored in time
            await replicas.unfence_others(rt.name)
            self._release_not_before = self.now + replicas.spec.poll_interval
            self._back_to(before, "release put off: the stop could not be made in time")
            return
        rt.metrics.idle_releases.labels(rt.name).inc()
        self._publish(rt.state.with_phase(Phase.COLD, self.now, endpoints=(), reason=reason))
        await self._close_streams()

    async def _close_streams(self) -> None:
        for close in list(self.rt.activity.streams.values()):
            with contextlib.suppress(Exception):
                await close(1001, "idle: the GPU is released")

    async def _scale_down(self) -> None:
        """After a failed start or a lost workload. With several replicas, never: the workload
        may serve another replica; a failed target whose workload runs on is released by
        idleness like a ready one (``decide``), fenced by the leader."""
        if self.keda:  # KEDA scales down once the scaler says inactive (and cooldown passed)
            return
        if self.replicas is not None:
            log.info("%s: left running: a stop is the leader's, once all are idle", self.rt.name)
            return
        await self.rt.backend.scale_down()

    # -- several replicas -----------------------------------------------------------------

    async def _fence_others(self) -> str | None:
        """The leader, about to release: every other replica holds new requests for the target
        (or says why it cannot); then the leadership is confirmed, right before the stop."""
        replicas, name = self.replicas, self.rt.name
        assert replicas is not None
        refused = await replicas.fence_others(name)
        if refused is None and not await replicas.membership.confirm():
            refused = "this replica is no longer the leader"
            await replicas.unfence_others(name)
        return refused

    def fence(self, until: float, leader: str) -> str | None:
        """Another replica, the leader, is about to release this target: if this replica is
        idle too, hold new requests from now until the release shows (or ``until``)."""
        rt, now = self.rt, self.now
        state, activity = rt.state, rt.activity
        if state.phase in (Phase.COLD, Phase.FAILED):
            return None if activity.held == 0 else "requests are held here"
        if state.phase is Phase.STARTING:
            return "starting here (probing the workload)"
        if state.phase is Phase.DRAINING and state.stopping:
            if not math.isinf(self._fenced_until):
                self._fenced_until = max(self._fenced_until, until)
            return None
        idle_since = activity.idle_since(rt.spec.scaling.stream_activity_window)
        if activity.held or idle_since is None:
            return "active here"
        idle = now - idle_since
        if idle + SLACK < rt.spec.scaling.idle_after:
            return f"idle for only {idle:.1f}s here"
        self._fenced_until, self._fenced_by = until, leader
        reason = f"{leader} is releasing it (idle for {idle:.0f}s here too)"
        self._publish(rt.state.with_phase(Phase.DRAINING, now, reason=reason, stopping=True))
        rt.wake.set()
        return None

    def unfence(self, reason: str = "the leader called the release off") -> None:
        if math.isinf(self._fenced_until):
            return
        self._fenced_until = -math.inf
        rt = self.rt
        if rt.state.phase is Phase.DRAINING and rt.state.stopping:
            endpoints = self._obs.endpoints
            if endpoints:
                self._publish(
                    rt.state.with_phase(
                        Phase.READY, self.now, endpoints=endpoints, reason=reason, stopping=False
                    )
                )
            else:  # the pod went meanwhile: wait for one, probed like any start
                self._next_probe = self.now
                self._publish(
                    rt.state.with_phase(
                        Phase.STARTING, self.now, endpoints=(), reason=reason, stopping=False
                    )
                )
        rt.wake.set()

    @property
    def _busy_window(self) -> float:
        """A busy answer keeps the target active until the next poll has surely happened."""
        return self.rt.spec.scaling.busy_poll + ACCOUNTING_INTERVAL

    async def _engine_busy(self, endpoint: str) -> bool:
        try:
            return await self.rt.engine.busy(endpoint)
        except Exception:  # an engine's probe must never stop its lifecycle
            log.exception("%s: busy check failed", self.rt.name)
            return False

    async def _account(self) -> None:
        """GPU-seconds while ready, split by activity; polls the engine's busy signal."""
        rt, now = self.rt, self.now
        elapsed, self._accounted_at = now - self._accounted_at, now
        if rt.state.phase is not Phase.READY:
            return
        if now >= self._next_busy_poll and rt.state.endpoints:
            self._next_busy_poll = now + rt.spec.scaling.busy_poll
            if await self._engine_busy(rt.state.endpoints[0]):
                rt.activity.busy_until = self.now + self._busy_window
        idle_since = rt.activity.idle_since(rt.spec.scaling.stream_activity_window)
        elapsed = max(0.0, elapsed)
        idle = 0.0 if idle_since is None else min(elapsed, max(0.0, now - idle_since))
        rt.metrics.gpu_seconds.labels(rt.name, "busy").inc(elapsed - idle)
        rt.metrics.gpu_seconds.labels(rt.name, "idle").inc(idle)
