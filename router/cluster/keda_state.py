"""What KEDA is told about a target: pure functions of a snapshot, no I/O and no awaits.

:func:`activeness` is the answer the external scaler gives (``IsActive``, ``StreamIsActive``,
``GetMetrics``); how the lifecycle runs a target whose replicas KEDA owns is
:mod:`router.scale.keda_mode` (docs/keda.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.base import Backend, outside_autoscaler
from router.scale.deadline import SLACK, idle_reached
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
    idle, release_at = idle_reached(w.now, w.idle_since, w.idle_after), w.idle_since + w.idle_after
    if phase is Phase.DRAINING and state.stopping:
        if idle:
            return answer(False, "idle: released")
        # another replica was active meanwhile
        return answer(True, "active on another replica within its idle window", release_at)
    if not idle:
        return answer(True, "within its idle window", release_at)
    return answer(False, f"idle for {now - w.idle_since:.0f}s")


def target_concurrency(backend: Backend) -> float:
    """Requests (in flight + held) per replica that KEDA's HPA aims for: what the backend's
    outside autoscaler says (the ``kubernetes`` backend in ``mode: keda``: its
    ``target_concurrency``), else 1 (one render per GPU)."""
    outside = outside_autoscaler(backend)
    return outside.target_concurrency if outside is not None else 1.0
