"""The steps a target's lifecycle performs, as data: one per kind of decision
(:class:`router.scale.scaling.Act`), each listing the events it applies and the metrics it
counts, with the code that performs it (the only I/O of a turn). :data:`STEPS` maps each kind
to its step; :class:`router.scale.lifecycle.Lifecycle` keeps the loop and the view, and looks
each decided step up here. What the steps perform with is :class:`router.scale.parts.Parts`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

from backends.base import ParkError, StartFailed, load_message, load_progress, parking
from backends.outside import one_line
from router.scale.accounting import ACCOUNTING_INTERVAL
from router.scale.machine import Event
from router.scale.parts import Parts
from router.scale.pools import How
from router.scale.scaling import OPERATOR_RELEASE, Act, Step, stage_now
from router.scale.state import Phase

log = logging.getLogger("warmgate.lifecycle")


Perform = Callable[[Parts, Step], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of step: what it applies and counts, and how it is performed."""

    act: Act
    applies: frozenset[Event]
    """Every event the step may apply (through the machine, or the fences' side)."""
    counts: frozenset[str]
    """The metrics (:class:`router.metrics.Metrics` fields) it counts; counted nowhere else."""
    perform: Perform


_STEPS: dict[Act, Kind] = {}
STEPS: Final[Mapping[Act, Kind]] = _STEPS
"""Each kind of step ``decide`` takes -> its step (``wait`` is the loop's own; ``fence`` is the
leader's ask, answered by :class:`router.scale.fencing.Fencing`)."""


def kind(
    act: Act, applies: Collection[Event], counts: Collection[str] = ()
) -> Callable[[Perform], Perform]:
    """The step of ``act``: its events, its metrics, and the function it is performed by."""

    def register(perform: Perform) -> Perform:
        _STEPS[act] = Kind(act, frozenset(applies), frozenset(counts), perform)
        return perform

    return register


_STOPPED: Final = frozenset({Event.STOP, Event.RELEASED, Event.FAIL})
"""A park or wake that failed: stopped instead, or failed where this replica may not stop."""
_RELEASE: Final = frozenset({Event.DRAIN, Event.PUT_OFF, Event.COMMIT, Event.RELEASED})


# -- a start ------------------------------------------------------------------------------------


@kind(Act.START, {Event.START}, counts={"cold_starts"})
async def start(p: Parts, step: Step) -> None:
    if not await p.seat():
        return  # decided again: it waits for a seat, saying why
    rt = p.rt
    p.adopted = False
    p.starting(Event.START, step.reason)
    p.began = rt.state.since
    rt.metrics.cold_starts.labels(rt.name).inc()
    if not p.keda:  # KEDA adds the replica: the held request made the scaler say active
        await rt.backend.scale_up()


@kind(Act.ADOPT, {Event.ADOPT})
async def adopt(p: Parts, step: Step) -> None:
    p.adopted = True
    p.starting(Event.ADOPT, step.reason)


@kind(Act.STAGE, {Event.STAGE})
async def stage(p: Parts, step: Step) -> None:
    p.starts.publish(*stage_now(p.view()))


@kind(
    Act.PROBE,
    {Event.READY, Event.FOUND_PARKED, Event.STAGE, Event.WOKE, *_STOPPED},
    counts={"cold_start_seconds", "wake_seconds"},
)
async def probe(p: Parts, step: Step) -> None:
    try:
        await _probe(p)
    except StartFailed as exc:  # the engine says why: no retry until the backoff
        await _start_failed(p, str(exc))


async def _probe(p: Parts) -> None:
    rt, obs = p.rt, p.rt.backend.observe()
    endpoint = (obs.endpoints or obs.probe_only)[0]  # not ready yet: for its words only
    p.probed_unready = not obs.endpoints
    if rt.state.phase is Phase.PARKED:  # waking
        if await p.parking.probe(endpoint) and rt.state.waking:
            seconds = p.now - rt.state.since
            rt.metrics.wake_seconds.labels(rt.name).observe(seconds)
            p.parking.woke(seconds)
            endpoints = rt.backend.observe().endpoints
            p.machine.apply(Event.WOKE, f"woke in {seconds:.1f}s", endpoints=endpoints)
            p.accounting.restart()
        else:
            p.next_probe = p.now + rt.spec.readiness.interval
        return
    ready = await rt.engine.probe_ready(endpoint)
    if not (ready and rt.state.phase is Phase.STARTING and rt.backend.observe().endpoints):
        said = load_message(rt.engine, endpoint)
        p.starts.progressed(load_progress(rt.engine, endpoint), said)
        p.next_probe = p.now + rt.spec.readiness.interval
        return
    engine = parking(rt.engine) if p.adopted else None
    if engine is not None and await engine.is_parked(endpoint) is True:  # found parked
        p.machine.apply(Event.FOUND_PARKED, "found parked (its engine says so)")
        return
    began = rt.state.since
    rt.metrics.cold_start_seconds.labels(rt.name).observe(p.now - began)
    stages = p.starts.so_far()  # the time no GPU was free is not what a start takes
    rt.learned.cold_start(p.now - began - p.starts.waited_for_gpu(), stages or None)
    rt.activity.wanted_until = float("-inf")
    rt.activity.last_request = p.now  # a fresh start gets a full idle window
    p.accounting.restart()
    endpoints = rt.backend.observe().endpoints
    p.machine.apply(Event.READY, f"ready after {p.now - began:.1f}s", endpoints=endpoints)


async def _start_failed(p: Parts, reason: str) -> None:
    """The engine's readiness answer says its start (or wake) failed and will not succeed as it
    is: failed at once with its reason, rather than at ``cold_start_timeout``."""
    if p.rt.state.phase is Phase.PARKED:
        await _stop_instead(p, f"the wake failed ({reason})")
        return
    _fail(p, reason, engine_said=True)
    await p.release.reap()


@kind(Act.RESTART, {Event.RESTART})
async def restart(p: Parts, step: Step) -> None:
    """The workload exited before it was ever ready, with requests held: started again at once,
    on the same start's clock (``cold_start_timeout`` and the learned ETA count from the first
    try)."""
    rt = p.rt
    log.warning("%s: %s", rt.name, step.reason)
    p.next_probe = p.now
    p.machine.apply(Event.RESTART, step.reason)
    if not p.keda:
        await p.release.reap()  # what is left of the child's group
        await rt.backend.scale_up()


@kind(Act.FAIL, {Event.FAIL})
async def fail(p: Parts, step: Step) -> None:
    _fail(p, step.reason, told=step.told)
    await p.release.reap()


def _fail(p: Parts, reason: str, *, engine_said: bool = False, told: str = "") -> None:
    """A failed cold start (or a park or wake this replica may not stop): ``failed``, with the
    backoff before the next try. ``engine_said``: the reason is the engine's own answer, which
    held requests are told too; ``told``: else what they are told (the workload's own last
    error)."""
    state = p.machine.apply(Event.FAIL, reason, told=reason if engine_said else told)
    wait = state.retry_at - p.now
    log.warning("%s: cold start failed (%s); next try in %.0fs", p.rt.name, reason, wait)


@kind(Act.ABANDON, {Event.ABANDON})
async def abandon(p: Parts, step: Step) -> None:
    """A start this replica alone began and nobody waits for any more: stopped (a pod left
    Pending must not take a GPU later with nobody there); phase -> cold, and the next request
    starts it again. KEDA scales it down once the scaler says inactive."""
    rt = p.rt
    log.warning("%s: start abandoned (%s)", rt.name, step.reason)
    rt.activity.wanted_until = float("-inf")
    if not p.keda:
        await rt.backend.scale_down()
    p.machine.apply(Event.ABANDON, f"start abandoned: {step.reason}")


@kind(Act.QUEUE, {Event.QUEUE}, counts={"pool_waits"})
async def queue(p: Parts, step: Step) -> None:
    """A start or wake waits for room in the target's GPU pool: say what for, and look again
    when a resident may be displaced (or anything in the pool changes)."""
    rt, waiting_for = p.rt, p.rt.state.waiting_for
    if waiting_for != step.reason:
        if step.reason and not waiting_for and rt.pool is not None:
            rt.metrics.pool_waits.labels(rt.pool.name, rt.name).inc()
            log.info("%s: %s", rt.name, step.reason)
        p.machine.apply(Event.QUEUE, step.reason)
    await p.wait(min(step.until, p.now + ACCOUNTING_INTERVAL) if step.reason else math.inf)


# -- ready, and what the backend says of it -----------------------------------------------------


@kind(Act.REFRESH, {Event.ENDPOINTS, Event.NO_ENDPOINT})
async def refresh(p: Parts, step: Step) -> None:
    """Ready endpoints changed: the new set is published at once (a request never goes to a pod
    that is gone once its watch event arrived); none left: back to starting."""
    rt = p.rt
    endpoints = rt.backend.observe().endpoints
    if endpoints:
        log.info("%s: ready endpoints now %s", rt.name, ", ".join(endpoints))
        p.machine.apply(Event.ENDPOINTS, endpoints=endpoints)
    else:
        p.starting(Event.NO_ENDPOINT, "no ready endpoint left; waiting for a replacement")


@kind(Act.LOST, {Event.LOST})
async def lost(p: Parts, step: Step) -> None:
    released = p.fencing.released()  # fenced: the leader released it
    p.machine.apply(Event.LOST, released or step.reason)
    if released is not None:
        await p.release.close_streams()
    elif p.others is None:  # one replica: reap what is left (a crashed child's group)
        await p.release.reap()


@kind(Act.RESUME, {Event.UNFENCE, Event.NO_ENDPOINT})
async def resume(p: Parts, step: Step) -> None:
    p.fencing.unfence(step.reason)


# -- a release ----------------------------------------------------------------------------------


@kind(Act.DRAIN, _RELEASE, counts={"idle_releases"})
@kind(Act.YIELD, _RELEASE, counts={"idle_releases", "pool_displacements"})
async def release(p: Parts, step: Step) -> None:
    """Decided, and decided again after the last look: the stop is committed (from here new
    requests are held for the next start, and streams, idle tabs, are closed), and made."""
    if not await _last_look(p, step):
        return
    rt = p.rt
    if step.reason == OPERATOR_RELEASE:  # the gap it ends was no person's: nothing learned
        rt.release_asked = False
        rt.learned.idling.forget_gap(rt.activity.idle_since(rt.spec.scaling.stream_activity_window))
    # YIELD: the idleness the others must show is the pool's ``yield_after``; else idle_after.
    needed = step.idle if step.act is Act.YIELD else None
    p.machine.apply(Event.COMMIT, step.reason)
    if await _released(p, step.reason, needed):
        rt.metrics.idle_releases.labels(rt.name).inc()
    if step.act is Act.YIELD and rt.pool is not None and rt.state.phase is not Phase.READY:
        rt.metrics.pool_displacements.labels(rt.pool.name, rt.name, "stop").inc()


async def _released(p: Parts, reason: str, needed: float | None) -> bool:
    """The committed stop made (by this replica alone, by the leader with the others fenced,
    or, when KEDA owns the replicas, left to KEDA); whether this replica counts it."""
    rt = p.rt
    if p.release.fences:
        refused = await p.release.as_leader(needed)
        if refused is not None:
            p.machine.apply(Event.PUT_OFF, f"release put off: {refused}")
            return False
        p.machine.apply(Event.RELEASED, reason)
        await p.release.close_streams()
        return True
    await p.release.close_streams()
    if p.keda:  # the scaler now says inactive; KEDA's scale-down ends this (-> cold)
        return p.others is None or p.others.leading()  # counted once
    await rt.backend.scale_down()
    p.machine.apply(Event.RELEASED, reason)
    return True


@kind(
    Act.PARK,
    {Event.PARK, Event.PUT_OFF, Event.PARKED, *_STOPPED},
    counts={"parks", "pool_displacements"},
)
async def park(p: Parts, step: Step) -> None:
    """Decided, and decided again after the last look: the engine drops its weights (the
    others fenced first, with several replicas); it failed: stopped instead."""
    if not await _last_look(p, step):
        return
    rt = p.rt
    rt.park_asked = False
    endpoints = rt.state.endpoints
    p.machine.apply(Event.PARK, step.reason)  # from here new requests are held (and wake it)
    others = p.others if p.release.fences else None
    if others is not None:
        refused = await p.fencing.fence_all(others, step.idle)
        if refused is not None:
            log.info("%s: park put off: %s", rt.name, refused)
            p.fencing.put_off(others)
            p.machine.apply(Event.PUT_OFF, f"park put off: {refused}")
            return
    try:
        await p.parking.park(endpoints)
    except ParkError as exc:
        await _stop_instead(p, f"the park failed ({exc})")
        return
    rt.metrics.parks.labels(rt.name).inc()
    if step.room_for and rt.pool is not None:
        rt.metrics.pool_displacements.labels(rt.pool.name, rt.name, "park").inc()
    p.machine.apply(Event.PARKED, step.reason)
    if others is not None:
        await others.parked_others(rt.name)


async def _last_look(p: Parts, step: Step) -> bool:
    """Before a release or a park, the engine's own queue is looked at once more (a render may
    have been queued since the last poll) while the target still serves: a request that arrives
    meanwhile is served, and counts. A release shows ``draining`` meanwhile (a parked target is
    held from the start: it serves nothing, and has no queue to look at). Then the step is
    decided again, over the phase it began in; ``False``: activity came meanwhile (a drain goes
    back to that phase), and the next turn decides anew."""
    if step.act is not Act.PARK:
        p.machine.apply(Event.DRAIN, step.reason)
    state = p.rt.state
    if not state.stopping and state.endpoints:
        await p.accounting.check_busy(state.endpoints[0])
    view = p.view()
    back_to = p.rt.state.back_to
    if back_to is not None:  # decided again over the phase it began in
        view = dataclasses.replace(view, state=back_to)
    if step.room_for:  # the pool chose it; whether it is still idle enough is asked again
        how: How = "park" if step.act is Act.PARK else "stop"
        view = dataclasses.replace(view, make_room=(step.room_for, how))
    again = p.decide(view)
    if again.act is step.act and again.room_for == step.room_for:
        return True
    if step.act is not Act.PARK:
        p.machine.apply(Event.PUT_OFF, "drain cancelled")
    return False


# -- the parked tier ----------------------------------------------------------------------------


@kind(Act.WAKE, {Event.WAKE, *_STOPPED})
async def wake(p: Parts, step: Step) -> None:
    if not await p.seat():
        return  # decided again: it waits for a seat, saying why
    rt = p.rt
    endpoints = rt.backend.observe().endpoints or rt.state.endpoints
    p.machine.apply(Event.WAKE, f"waking: {step.reason}")
    try:
        await p.parking.wake(endpoints)
    except ParkError as exc:
        await _stop_instead(p, f"the wake failed ({exc})")
    p.next_probe = p.now


@kind(Act.STOP, _STOPPED)
async def stop(p: Parts, step: Step) -> None:
    await _stop_instead(p, step.reason)


async def _stop_instead(p: Parts, why: str) -> None:
    """A park or wake that failed: the target is stopped (the next request starts it cold);
    where this replica may not stop it (KEDA owns it, or another replica leads), it is marked
    failed, and released by idleness like any failed start."""
    rt = p.rt
    log.warning("%s: %s; stopping it instead", rt.name, why)
    if p.keda or (p.others is not None and not p.others.leading()):
        _fail(p, why)
        return
    p.machine.apply(Event.STOP, why)
    await p.release.close_streams()
    await rt.backend.scale_down()
    p.machine.apply(Event.RELEASED, f"stopped: {why}")


# -- a step that raised -------------------------------------------------------------------------


async def recover(p: Parts, step: Step, exc: Exception) -> None:
    """A step raised (a backend error): the phase is put right before the error is counted. A
    start is failed (never holding the GPU in a backoff); a release that could not be made
    serves again once probed ready (never left holding requests for a stop), the others let
    go."""
    if (phase := p.rt.state.phase) is Phase.STARTING:
        _fail(p, f"{step.act.value} failed: {one_line(exc)}")
        with contextlib.suppress(Exception):
            await p.release.reap()
    elif phase is Phase.DRAINING and not p.fencing.fenced:
        p.machine.apply(Event.RELEASE_FAILED, f"release failed: {exc}")
        await p.release.let_go()
        p.next_probe = p.now
