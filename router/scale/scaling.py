"""What a target's lifecycle should do next: a pure function of (snapshot, now).

No I/O and no awaits here; :mod:`router.scale.lifecycle` performs the step and comes back.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from backends.base import Observation, Stage
from router.config import Scaling
from router.scale.deadline import SLACK, idle_reached
from router.scale.pools import How, Wait
from router.scale.state import Phase, TargetState


class Act(enum.Enum):
    WAIT = "wait"
    """Nothing to do until ``until`` or until something changes."""
    START = "start"
    """Ask the backend to run the workload; phase -> starting."""
    PROBE = "probe"
    """Ask the engine whether the workload is ready (weights resident)."""
    RESTART = "restart"
    """Starting, and the workload exited before it was ever ready while requests are held (or
    the waiting page is open): started again at once (at most ``scaling.start_retries`` times a
    start)."""
    FAIL = "fail"
    """The cold start failed; phase -> failed, held requests answered, backoff."""
    LOST = "lost"
    """The workload died while ready or draining; phase -> cold."""
    DRAIN = "drain"
    """Idle long enough: close idle streams, stop the workload; phase -> draining -> cold."""
    ADOPT = "adopt"
    """Cold, but the workload is running (started by someone else, or found after a restart
    while the cluster was unreachable): phase -> starting, probed like a start of our own."""
    REFRESH = "refresh"
    """Ready, and the backend's ready endpoints changed (a pod went or came): republish them;
    none left -> starting, waiting for a replacement."""
    STAGE = "stage"
    """Starting, and the start moved on (waiting for a GPU, pulling, loading, ...): publish
    the stage, its message and the load progress."""
    ABANDON = "abandon"
    """Starting, and nobody waits for it any more (``abandon_after``): stopped; phase -> cold."""
    RESUME = "resume"
    """Draining for a release another replica (the leader) announced, which did not come in
    time: phase -> ready, serving again."""
    PARK = "park"
    """Ready and idle for ``park_after`` (or chosen to make room in its pool): the engine drops
    its weights, its process stays; phase -> parked."""
    WAKE = "wake"
    """Parked, and work waits: the engine loads its weights again, probed like a start; phase
    parked (waking) -> ready."""
    YIELD = "yield"
    """Chosen to make room in its pool and it cannot be parked: stopped like an idle release."""
    QUEUE = "queue"
    """A start or wake waits for room in the target's GPU pool: say what for (``reason``; empty
    once nothing waits any more) and look again at ``until``."""
    STOP = "stop"
    """A wake did not finish: stopped instead (the next request starts it cold)."""
    FENCE = "fence"
    """Not a step of the lifecycle's own: the leader's fence agreed to (:func:`answer_fence`);
    phase -> draining, new requests held until the leader's release shows."""


@dataclass(frozen=True, slots=True)
class View:
    state: TargetState
    observation: Observation
    scaling: Scaling
    now: float
    held: int = 0
    wanted: bool = False
    """Someone asked for a start without holding a request (waiting page, warm_on_cloud)."""
    in_flight: int = 0
    idle_since: float | None = None
    next_probe: float = 0.0
    always_on: bool = False
    may_release: bool = True
    """This replica may decide a release (the only one, or the leader of several)."""
    release_not_before: float = -math.inf
    """A release was just put off (another replica was active): not again before this."""
    fenced_until: float = -math.inf
    """Draining for a release the leader announced: serving again at this loop time if the
    workload is still running then."""
    last_wanted: float = -math.inf
    """Loop time someone last waited for the target (a hold ended, the waiting page asked):
    a start nobody waited for since ``abandon_after`` is abandoned."""
    abandonable: bool = False
    """A start this replica began itself, and no other replica may be served by it: given up
    when nobody waits for it any more (an adopted start, or one with other replicas, is not)."""
    idle_after: float | None = None
    """Seconds idle before a release, as in force now (``idle_after: auto``: as learned);
    ``None``: the config's fixed value."""
    park_after: float | None = None
    """Seconds idle before a park, as in force now (``park_after: auto``: as learned; 0: never
    parked for idleness); ``None``: the config's fixed value."""
    kept_warm: bool = False
    """Inside a ``scaling.keep_warm`` window: started ahead of use, never released for idleness."""
    can_park: bool = False
    """The engine has a park action (docs/pools.md)."""
    park_asked: bool = False
    """Parking was asked for (the dashboard's park): parked once idle, whatever ``park_after``."""
    turn: Wait | None = None
    """In a full GPU pool: what a start or wake would wait for; ``None``: it may go."""
    make_room: tuple[str, How] | None = None
    """Chosen to make room in its pool: (for whom, parked or stopped)."""
    yield_after: float = 0.0
    """The pool's ``yield_after``: the idleness a displacement needs."""
    closing: bool = False
    """warmgate is draining (SIGTERM): no cold start begins."""
    release_asked: bool = False
    """An operator asked for the release (the dashboard's release): released once nothing is
    at work, whatever ``idle_after``, and it teaches the idle rule nothing."""

    @property
    def release_after(self) -> float:
        return self.scaling.idle_seconds if self.idle_after is None else self.idle_after

    @property
    def park_window(self) -> float:
        return self.scaling.park_seconds if self.park_after is None else self.park_after


@dataclass(frozen=True, slots=True)
class Step:
    act: Act
    until: float = math.inf
    reason: str = ""
    idle: float = 0.0
    """PARK and YIELD: the idleness they need, checked again right before the engine is asked."""
    room_for: str = ""
    """PARK and YIELD that make room in a GPU pool: the target they make room for."""
    told: str = ""
    """FAIL: what the requests held for the start are told (the workload's own last error)."""


OPERATOR_RELEASE = "released by an operator"
"""The reason of a release an operator asked for (``POST /targets/<name>/release``)."""


def backoff(failures: int, scaling: Scaling) -> float:
    """Seconds to wait after the ``failures``-th failed start in a row (doubling, capped)."""
    return float(
        min(scaling.failure_backoff * 2 ** max(0, failures - 1), scaling.failure_backoff_max)
    )


def decide(v: View) -> Step:
    state, obs, now = v.state, v.observation, v.now + SLACK
    if v.always_on:
        return Step(Act.WAIT)
    phase = state.phase
    if v.closing and (phase is Phase.COLD or phase is Phase.FAILED):
        return Step(Act.WAIT)  # the SIGTERM drain: no cold start begins

    if phase is Phase.COLD:
        if obs.running and not obs.crashed:
            return Step(Act.ADOPT, reason="found running")
        if v.held > 0:
            return _turn(v, Act.START, "a request is waiting")
        if v.wanted:
            return _turn(v, Act.START, "asked to warm up")
        if v.kept_warm:
            return _turn(v, Act.START, "kept warm (keep_warm)")
        return Step(Act.QUEUE) if state.waiting_for else Step(Act.WAIT)

    if phase is Phase.FAILED:
        release = Step(Act.WAIT)
        if obs.running and not obs.crashed and v.idle_since is not None and v.held == 0:
            # The workload outlived the failed start (another warmgate replica serves it, or
            # KEDA keeps it): released by idleness, like a ready one.
            release = _idle_release(v, now, "failed here, ")
            if release.act is Act.DRAIN:
                return release
        if now < state.retry_at:
            return Step(Act.WAIT, until=min(state.retry_at, release.until))
        if v.held > 0 or v.wanted or v.kept_warm:
            return _turn(v, Act.START, "retrying after backoff")
        return release

    if phase is Phase.STARTING:
        return _starting(v, now)

    if phase is Phase.READY or phase is Phase.DRAINING:
        if obs.crashed or not obs.running:
            return Step(Act.LOST, reason=obs.failure or "the workload stopped")
        if phase is Phase.DRAINING:
            if math.isinf(v.fenced_until):
                return Step(Act.WAIT)  # the lifecycle is performing the drain
            if now >= v.fenced_until:
                return Step(Act.RESUME, reason="the leader's release did not come; serving again")
            return Step(Act.WAIT, until=v.fenced_until)  # the leader is releasing it
        if obs.endpoints != state.endpoints or not state.endpoints:  # none left included
            return Step(Act.REFRESH, reason="ready endpoints changed")
        if v.idle_since is None or v.held > 0:
            return Step(Act.WAIT)
        if v.release_asked and v.may_release:
            return Step(Act.DRAIN, reason=OPERATOR_RELEASE)
        if v.kept_warm:
            return Step(Act.WAIT)
        if v.make_room is not None and v.may_release:
            whom, how = v.make_room
            act = Act.PARK if how == "park" else Act.YIELD
            reason = f"making room for {whom} in its pool"
            return Step(act, reason=reason, idle=v.yield_after, room_for=whom)
        return _park_or_release(v, now)

    if phase is Phase.PARKED:
        return _parked(v, now)

    raise AssertionError(f"unhandled phase {phase}")


def _turn(v: View, act: Act, reason: str) -> Step:
    """A start or wake, when the target's pool has room for it; else what it waits for."""
    if v.turn is not None:
        return Step(Act.QUEUE, until=v.turn.until, reason=v.turn.reason)
    return Step(act, reason=reason)


def _park_or_release(v: View, now: float) -> Step:
    """Ready and idle: parked after ``park_after`` (or once asked), released after
    ``idle_after``; else wait for the first of the two."""
    assert v.idle_since is not None
    release = _idle_release(v, now, "")
    park_after = v.park_window
    if release.act is Act.DRAIN or not v.can_park or not (park_after > 0 or v.park_asked):
        return release
    due = v.park_asked or idle_reached(v.now, v.idle_since, park_after)
    if not due or now < v.release_not_before:
        park_at = -math.inf if v.park_asked else v.idle_since + park_after
        return Step(Act.WAIT, until=min(max(park_at, v.release_not_before), release.until))
    if not v.may_release:
        return release
    reason = "asked to park" if v.park_asked else f"idle for {now - v.idle_since:.0f}s"
    return Step(Act.PARK, reason=reason, idle=0.0 if v.park_asked else park_after)


def _parked(v: View, now: float) -> Step:
    state, obs = v.state, v.observation
    if obs.crashed or not obs.running:
        return Step(Act.LOST, reason=obs.failure or "the workload stopped")
    if state.waking:
        deadline = state.since + v.scaling.cold_start_timeout
        if now >= deadline:
            return Step(Act.STOP, reason=f"not awake after {v.scaling.cold_start_timeout:g}s")
        if obs.endpoints and now >= v.next_probe:
            return Step(Act.PROBE)
        return Step(Act.WAIT, until=min(deadline, v.next_probe) if obs.endpoints else deadline)
    if state.parking:
        return Step(Act.WAIT)  # the lifecycle is performing the park
    if state.endpoints and obs.endpoints != state.endpoints:
        return Step(Act.REFRESH, reason="ready endpoints changed")
    if v.held > 0:
        return _turn(v, Act.WAKE, "a request is waiting")
    if v.wanted:
        return _turn(v, Act.WAKE, "asked to warm up")
    if v.kept_warm:
        return _turn(v, Act.WAKE, "kept warm (keep_warm)")
    if state.waiting_for:
        return Step(Act.QUEUE)
    if v.idle_since is None:
        return Step(Act.WAIT)
    if v.release_asked and v.may_release:
        return Step(Act.DRAIN, reason=OPERATOR_RELEASE)
    return _idle_release(v, now, "parked, ")


def _idle_release(v: View, now: float, why: str) -> Step:
    """Drain once idle for ``idle_after`` (and not put off), when this replica may release;
    else wait for that moment (or, past it, for a change of leader, which wakes the loop)."""
    assert v.idle_since is not None
    if not idle_reached(v.now, v.idle_since, v.release_after) or now < v.release_not_before:
        return Step(Act.WAIT, until=max(v.idle_since + v.release_after, v.release_not_before))
    if not v.may_release:
        return Step(Act.WAIT)
    return Step(Act.DRAIN, reason=f"{why}idle for {now - v.idle_since:.0f}s")


def stage_now(v: View) -> tuple[Stage | None, str, float | None]:
    """The stage a start is in, its message and the load progress: the backend's word; past
    its stages (or with endpoints to probe) and not ready yet: ``loading``, with the progress
    and the words the engine (or the backend) reported."""
    obs, state = v.observation, v.state
    stage = obs.stage
    if stage is None and (obs.endpoints or state.stage is not None):
        stage = "loading"
    progress = obs.progress if obs.progress is not None else state.progress
    # The engine's own words (its readiness answer's) stand while the backend has none and the
    # stage is the same: a new stage's words are the backend's, or the engine's next answer.
    kept = state.stage_message if stage == state.stage else ""
    return stage, obs.stage_message or kept, progress if stage == "loading" else None


def abandon_at(v: View) -> float:
    """Loop time a start nobody waits for is given up: ``abandon_after`` after the later of
    its beginning, the last activity and the last wait; never while a request is held or in
    flight, in a ``keep_warm`` window, or for a start this replica alone did not begin."""
    after = v.scaling.abandon_after
    if not v.abandonable or after <= 0 or v.held > 0 or v.in_flight > 0 or v.kept_warm:
        return math.inf
    if v.idle_since is None:
        return math.inf
    return max(v.state.since, v.idle_since, v.last_wanted) + after


def _exited(v: View, now: float, deadline: float) -> Step:
    """The workload exited during its start: started again while someone waits for it (a
    Gradio app can die in its own launch check on a loaded host, and start the next time), at
    most ``start_retries`` times; then failed, its own last error told."""
    state, obs = v.state, v.observation
    said = obs.last_error or ""
    failure = obs.failure or "the workload exited while starting"
    reason = failure if not said or said in failure else f"{failure}: {said}"
    tries = v.scaling.start_retries
    waited = v.held > 0 or v.wanted  # a held request, or a person on the waiting page
    if obs.crashed and waited and state.restarts < tries and now < deadline:
        again = f"{reason}; started again ({state.restarts + 1} of {tries})"
        return Step(Act.RESTART, reason=again)
    return Step(Act.FAIL, reason=reason, told=said)


def _starting(v: View, now: float) -> Step:
    state, obs = v.state, v.observation
    deadline = state.since + v.scaling.cold_start_timeout
    if obs.crashed or obs.failure:
        return _exited(v, now, deadline)
    if now >= deadline:
        limit = v.scaling.cold_start_timeout
        return Step(Act.FAIL, reason=f"not ready after {limit:g}s")
    give_up = abandon_at(v)
    if now >= give_up:
        return Step(Act.ABANDON, reason=f"nobody waited for it for {v.scaling.abandon_after:g}s")
    # A workload that runs but is not ready yet (``probe_only``: a pod whose readiness probe
    # fails) is probed too: its engine may say it failed, or how far its load is.
    probed = bool(obs.endpoints or obs.probe_only)
    if probed and now >= v.next_probe:
        return Step(Act.PROBE)
    if stage_now(v) != (state.stage, state.stage_message, state.progress):
        return Step(Act.STAGE, reason=obs.stage_message)
    until = min(deadline, give_up, v.next_probe if probed else math.inf)
    return Step(Act.WAIT, until=until)


def answer_fence(v: View, needed: float | None) -> Step:
    """The leader of the replicas is about to release (or park) the target and asks this
    replica to hold its new requests meanwhile: :attr:`Act.FENCE` (held from now on),
    :attr:`Act.WAIT` with the reason it is refused, or :attr:`Act.WAIT` with none (agreed,
    nothing to hold: cold, failed, or already stopping). ``needed``: the idleness the leader's
    step needs (a park's is shorter than ``idle_after``); ``None``: a release's."""
    state = v.state
    if state.phase is Phase.COLD or state.phase is Phase.FAILED:
        return Step(Act.WAIT, reason="" if v.held == 0 else "requests are held here")
    if state.phase is Phase.STARTING:
        return Step(Act.WAIT, reason="starting here (probing the workload)")
    if state.phase is Phase.DRAINING and state.stopping:
        return Step(Act.WAIT)
    if v.held or v.idle_since is None:
        return Step(Act.WAIT, reason="active here")
    idle = v.now - v.idle_since
    if not idle_reached(v.now, v.idle_since, v.release_after if needed is None else needed):
        return Step(Act.WAIT, reason=f"idle for only {idle:.1f}s here")
    return Step(Act.FENCE, reason=f"idle for {idle:.0f}s here too")
