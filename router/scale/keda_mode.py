"""A target whose replicas KEDA owns (the ``kubernetes`` backend's ``mode: keda``): how its
lifecycle knows, and the steps it takes (docs/keda.md).

Pure, next to :func:`router.scale.scaling.decide`: no I/O and no awaits. What KEDA is told of a
target is the scaler's (:mod:`router.cluster.keda_state`).
"""

from __future__ import annotations

from backends.base import Backend, outside_autoscaler
from router.scale.deadline import idle_reached
from router.scale.scaling import Act, Step, View, decide
from router.scale.state import Phase


def keda_owns_replicas(backend: Backend) -> bool:
    """An autoscaler outside warmgate (KEDA, with warmgate as its scaler) owns the backend's
    replicas: the lifecycle never scales it, it only waits."""
    return outside_autoscaler(backend) is not None


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
        if v.idle_since is None or not idle_reached(v.now, v.idle_since, v.release_after):
            # another warmgate replica was active meanwhile: the scaler says active again
            return Step(Act.ADOPT, reason="active on another replica")
        return Step(Act.WAIT)
    step = decide(v)
    if step.act is Act.FAIL and not (obs.crashed or obs.failure) and not obs.endpoints:
        limit = v.scaling.cold_start_timeout
        reason = f"KEDA added no ready replica within {limit:g}s (is the ScaledObject's trigger "
        return Step(Act.FAIL, reason=reason + "an external-push to warmgate's scaler_listen?)")
    return step
