"""What a target's lifecycle should do next: a pure function of (snapshot, now).

No I/O and no awaits here; :mod:`router.scale.lifecycle` performs the step and comes back.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from backends.base import Observation
from router.config import Scaling
from router.scale.state import Phase, TargetState


class Act(enum.Enum):
    WAIT = "wait"
    """Nothing to do until ``until`` or until something changes."""
    START = "start"
    """Ask the backend to run the workload; phase -> starting."""
    PROBE = "probe"
    """Ask the engine whether the workload is ready (weights resident)."""
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
    RESUME = "resume"
    """Draining for a release another replica (the leader) announced, which did not come in
    time: phase -> ready, serving again."""


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
    idle_after: float | None = None
    """Seconds idle before a release, as in force now (``idle_after: auto``: as learned);
    ``None``: the config's fixed value."""
    kept_warm: bool = False
    """Inside a ``scaling.keep_warm`` window: started ahead of use, never released for idleness."""
    closing: bool = False
    """warmgate is draining (SIGTERM): no cold start begins."""

    @property
    def release_after(self) -> float:
        return self.scaling.idle_seconds if self.idle_after is None else self.idle_after


@dataclass(frozen=True, slots=True)
class Step:
    act: Act
    until: float = math.inf
    reason: str = ""


SLACK = 0.001
"""Seconds: a deadline this close counts as reached (clocks are not infinitely fine, and a
timer that fires a hair early must not make the lifecycle spin)."""


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
            return Step(Act.START, reason="a request is waiting")
        if v.wanted:
            return Step(Act.START, reason="asked to warm up")
        if v.kept_warm:
            return Step(Act.START, reason="kept warm (keep_warm)")
        return Step(Act.WAIT)

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
            return Step(Act.START, reason="retrying after backoff")
        return release

    if phase is Phase.STARTING:
        if obs.crashed or obs.failure:
            return Step(Act.FAIL, reason=obs.failure or "the workload exited while starting")
        deadline = state.since + v.scaling.cold_start_timeout
        if now >= deadline:
            limit = v.scaling.cold_start_timeout
            return Step(Act.FAIL, reason=f"not ready after {limit:g}s")
        if obs.endpoints and now >= v.next_probe:
            return Step(Act.PROBE)
        until = min(deadline, v.next_probe) if obs.endpoints else deadline
        return Step(Act.WAIT, until=until)

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
        if v.idle_since is None or v.held > 0 or v.kept_warm:
            return Step(Act.WAIT)
        return _idle_release(v, now, "")

    raise AssertionError(f"unhandled phase {phase}")


def _idle_release(v: View, now: float, why: str) -> Step:
    """Drain once idle for ``idle_after`` (and not put off), when this replica may release;
    else wait for that moment (or, past it, for a change of leader, which wakes the loop)."""
    assert v.idle_since is not None
    release_at = max(v.idle_since + v.release_after, v.release_not_before)
    if now < release_at:
        return Step(Act.WAIT, until=release_at)
    if not v.may_release:
        return Step(Act.WAIT)
    return Step(Act.DRAIN, reason=f"{why}idle for {now - v.idle_since:.0f}s")
