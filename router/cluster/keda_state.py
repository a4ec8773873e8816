"""What KEDA is told about a target, and how the lifecycle runs one whose replicas KEDA owns.

Pure functions of a snapshot, next to :func:`router.scale.scaling.decide`: :func:`activeness` is the
answer the external scaler gives (``IsActive``, ``StreamIsActive``, ``GetMetrics``);
:func:`decide_keda` is ``decide`` for a ``mode: keda`` target, where warmgate never scales: a
start only waits for the replica KEDA adds, and a drain only waits for KEDA to take it away.
No I/O and no awaits here (docs/keda.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.config import Target
from router.scale.scaling import SLACK, Act, Step, View, decide
from router.scale.state import Phase, TargetState

RECHECK_HELD = 1.0
"""Seconds: an answer that is ``active`` only because a request is held in a cold phase is looked
at again this soon (the lifecycle leaves the cold phase at once; a hold given up in the same
instant would otherwise leave KEDA told ``active`` until the next event)."""


@dataclass(frozen=True, slots=True)
class Wants:
    """What the scaler reads of one target: its snapshot and its activity, at one instant."""

    state: TargetState
    now: float
    idle_after: float
    held: int = 0
    in_flight: int = 0
    idle_since: float | None = None
    """As :meth:`router.scale.activity.Activity.idle_since`: ``None`` while requests are in flight;
    a busy engine and streams that carried frames recently push it forward."""
    wanted_until: float = -math.inf
    """Someone asked for a start without holding a request (waiting page, warm_on_cloud)."""


@dataclass(frozen=True, slots=True)
class Activeness:
    active: bool
    """KEDA's ``IsActive``: the target needs a replica (scale from / to zero)."""
    metric: int
    """KEDA's metric (``GetMetrics``): requests in flight plus requests held."""
    recheck_at: float
    """Loop time at which ``active`` may change with no event (an idle window running out);
    ``inf``: only a phase change or a new hold can change it."""
    reason: str


def activeness(w: Wants) -> Activeness:
    """Whether the target is wanted, by warmgate's own idle rules: a held or in-flight request,
    a busy engine, a start under way, or an idle window not run out yet."""
    state, now, metric = w.state, w.now + SLACK, w.in_flight + w.held
    phase = state.phase

    def answer(active: bool, reason: str, recheck_at: float = math.inf) -> Activeness:
        return Activeness(active, metric, recheck_at, reason)

    if phase is Phase.FAILED and now < state.retry_at:
        return answer(False, "cold start failed; in backoff", state.retry_at)
    if w.held > 0:
        cold = phase in (Phase.COLD, Phase.FAILED)
        return answer(True, "a request is held", w.now + RECHECK_HELD if cold else math.inf)
    if w.in_flight > 0:
        return answer(True, "requests in flight", w.now + w.idle_after)
    if now < w.wanted_until:
        return answer(True, "asked to warm up", w.wanted_until)
    if phase in (Phase.COLD, Phase.FAILED):
        return answer(False, "scaled to zero")
    if phase is Phase.STARTING:
        return answer(True, "starting")
    if w.idle_since is None:  # once stopping: only through another warmgate replica
        return answer(True, "active", w.now + w.idle_after)
    if phase is Phase.DRAINING and state.stopping and now >= w.idle_since + w.idle_after:
        return answer(False, "idle: released")
    if phase is Phase.DRAINING and state.stopping:  # another replica was active meanwhile
        release_at = w.idle_since + w.idle_after
        return answer(True, "active on another replica within its idle window", release_at)
    release_at = w.idle_since + w.idle_after
    if now < release_at:
        return answer(True, "within its idle window", release_at)
    return answer(False, f"idle for {now - w.idle_since:.0f}s")


# -- mode: keda ---------------------------------------------------------------------------------


def keda_owns_replicas(target: Target) -> bool:
    """The target's backend says ``mode: keda``: KEDA scales it, warmgate is its scaler.

    Read by name: ``mode`` belongs to the ``kubernetes`` backend's config (backends/specs.py);
    every other backend kind is scaled by warmgate itself."""
    return getattr(target.backend, "mode", "direct") == "keda"


def target_concurrency(target: Target) -> float:
    """Requests (in flight + held) per replica that KEDA's HPA aims for; the ``kubernetes``
    backend's ``target_concurrency`` where it has one, else 1 (one render per GPU)."""
    value = getattr(target.backend, "target_concurrency", None)  # kubernetes backends have it
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0


def decide_keda(v: View) -> Step:
    """:func:`router.scale.scaling.decide` for a target whose replicas KEDA owns.

    The steps are the same; what the lifecycle does differs (it never calls the backend's
    ``scale_up``/``scale_down``): ``START`` only publishes ``starting`` (the held request has
    already made the scaler push ``active``), and a ``DRAIN`` ends in ``draining`` with the stop
    committed, until KEDA has taken the replicas away. Two cases are KEDA's own:

    - draining, stop committed, workload gone: KEDA scaled it to zero -> ``LOST`` (-> cold);
    - draining, stop committed, a request held: the scaler said ``active`` again, so KEDA keeps
      (or brings back) the replica -> ``ADOPT`` (-> starting, probed, ready).
    """
    state, obs = v.state, v.observation
    if state.phase is Phase.DRAINING and state.stopping:
        if obs.crashed or not obs.running:
            return Step(Act.LOST, reason="KEDA scaled it to zero")
        if v.held > 0:
            return Step(Act.ADOPT, reason="a request arrived while KEDA was scaling it down")
        if v.idle_since is None or v.idle_since + v.scaling.idle_after > v.now + SLACK:
            # another warmgate replica was active meanwhile: the scaler says active again
            return Step(Act.ADOPT, reason="active on another replica")
        return Step(Act.WAIT)
    step = decide(v)
    if step.act is Act.FAIL and not (obs.crashed or obs.failure) and not obs.endpoints:
        limit = v.scaling.cold_start_timeout
        reason = f"KEDA added no ready replica within {limit:g}s (is the ScaledObject's trigger "
        return Step(Act.FAIL, reason=reason + "an external-push to warmgate's scaler_listen?)")
    return step
