"""Where one API request runs: a pure function of (request, snapshot of its placements, budget,
rules, now) -> :class:`Decision`. No I/O and no awaits; :mod:`router.openai.api` acts on it.
The snapshot's parts are immutable named tuples: built on every request, they must be cheap.

The table (docs/openai.md has it for people):

- a local target ready and not saturated -> ``local``; saturated is a load (warmgate's own API
  requests, or the engine's own queue where it tells one) over ``overflow_queue_depth``, or a
  predicted wait in that queue (depth x learned time per job) over the latency budget: then the
  cloud when allowed (``local_busy``, the depth in the header), else local anyway;
- local cold, starting or parked and predicted ready within the latency budget -> ``hold`` (a
  parked target is predicted from its learned wake time, a cold one from its cold starts);
- local waiting for its GPU pool with nothing to displace: the wait is unknown -> the cloud when
  allowed, else ``hold``;
- local starting but unschedulable (no GPU free in the cluster): the wait is unknown -> the
  cloud at once when allowed (``local_unschedulable``), else ``hold`` up to its deadline;
- otherwise the cloud when allowed (not private, affordable, configured), warming the local
  target with ``warm_on_cloud``;
- the cloud not allowed: private -> ``reject`` 503 (the work never leaves the building), budget
  exhausted or cloud missing -> ``hold`` (local if possible), else ``reject`` 429/503;
- after a cloud failure: local when it can serve within what is left of the latency budget.

Rejections never invite a retry loop: the caller answers them with ``x-should-retry: false``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

from router.scale.state import Phase


class Action(enum.Enum):
    LOCAL = "local"
    """Forward to a ready local target."""
    HOLD = "hold"
    """Wait for a local target's cold start (it is started if cold)."""
    CLOUD = "cloud"
    """Send to the cloud; the estimated cost is reserved first."""
    REJECT = "reject"
    """Answer an error now (``status``), with the reason."""


class LocalOption(NamedTuple):
    """One local placement as it is right now."""

    position: int
    """Position among the model's placements."""
    target: str
    phase: Phase
    since: float
    """Loop time the phase began."""
    servable: bool
    """Ready (or draining with the stop not issued): a request is forwarded at once."""
    load: int = 0
    """The target's load: API requests in progress on it (streams included), or the jobs in
    its engine's own queue (``queue``) where that is more."""
    held: int = 0
    max_held: int = 1000
    cold_start: float = 30.0
    """Predicted seconds from scale-up to ready, learned from this target's cold starts."""
    retry_at: float = 0.0
    """In ``failed``: loop time before which no new start is tried."""
    wakes: bool = True
    """Whether a request like this one may start the target."""
    wake: float = 2.0
    """Predicted seconds from parked to ready, learned from this target's wakes."""
    waking: bool = False
    """Parked, and its wake began at ``since``."""
    pool_wait: str = ""
    """Its GPU pool is full and nothing in it may be displaced yet: what it waits for. How long
    is unknown (``ready_in`` is ``inf``; :func:`decide` tells it from a target that cannot
    start)."""
    unschedulable: str = ""
    """Starting, and no node can take it now (every GPU busy with other work): the scheduler's
    words. How long is unknown (``ready_in`` is ``inf``): the cloud when allowed, else held."""
    queue: int = 0
    """Ready: the jobs in the engine's own queue at the last busy poll (ComfyUI's
    ``queue_remaining``, ...); 0 where the engine tells none."""
    queue_wait: float = 0.0
    """Ready: seconds a request would wait in that queue (``queue`` x the learned time per
    job); 0 while nothing is learned. Counted against the latency budget like a cold start."""

    def ready_in(self, now: float) -> float:
        """Predicted seconds until it can serve; ``inf`` when it cannot be started now, or when
        nobody can say (``pool_wait``)."""
        if self.servable:
            return 0.0
        if self.held >= self.max_held or self.pool_wait or self.unschedulable:
            return math.inf
        phase = self.phase
        if phase is Phase.STARTING:
            return max(0.0, self.since + self.cold_start - now)
        if phase is Phase.PARKED:
            if self.waking:
                return max(0.0, self.since + self.wake - now)
            return self.wake if self.wakes else math.inf
        if not self.wakes or (phase is Phase.FAILED and now < self.retry_at):
            return math.inf
        return self.cold_start  # cold, failed after its backoff, or draining with the stop issued


class CloudOption(NamedTuple):
    position: int
    cloud: str
    model: str
    available: bool
    """The cloud is configured (its API key was set at start)."""
    cost: float
    """Estimated USD for this request: what is reserved against the budget."""

    @property
    def label(self) -> str:
        return f"{self.cloud}/{self.model}"


@dataclass(frozen=True, slots=True)
class Ask:
    """The request, as far as the policy cares."""

    private: bool
    max_wait: float
    """Seconds this request may wait for a cold local target."""
    waited: float = 0.0
    """Seconds already spent (a cloud attempt that failed, a hold that outran its prediction)."""
    cloud_failed: bool = False
    """Deciding again after the cloud failed: only local remains."""


class Snapshot(NamedTuple):
    locals: tuple[LocalOption, ...]
    clouds: tuple[CloudOption, ...]
    budget_left: float
    """USD the day's budget still allows, outstanding reservations deducted."""
    now: float


@dataclass(frozen=True, slots=True)
class Rules:
    overflow_queue_depth: int = 4
    warm_on_cloud: bool = True


class Decision(NamedTuple):
    action: Action
    reason: str
    """Short, stable token: a metric label and the header's ``reason=``."""
    detail: str
    """A sentence for people: logs and error messages."""
    local: LocalOption | None = None
    cloud: CloudOption | None = None
    warm: str | None = None
    """A target to start without holding this request (``warm_on_cloud``)."""
    status: int = 0
    """For ``reject``: the HTTP status."""
    queue_depth: int | None = None
    """``local_busy``: the busy target's load (the depth of its queue) behind the decision;
    said in the header as ``queue_depth=``."""

    @property
    def placement(self) -> str:
        if self.local is not None:
            return self.local.target
        if self.cloud is not None:
            return self.cloud.label
        return "none"

    @property
    def header(self) -> str:
        """The ``X-Warmgate-Decision`` value (``comfyui; reason=ready``,
        ``managed/image-large; reason=local_busy; queue_depth=7``)."""
        head = f"{self.placement}; reason={self.reason}"
        return head if self.queue_depth is None else f"{head}; queue_depth={self.queue_depth}"


def _fits(cost: float, left: float) -> bool:
    """Whether a cost fits what is left, with slack for float sums (as the budget allows)."""
    return cost <= left + 1e-9


def _secs(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.0f}s"


def _busy(opt: LocalOption, depth: int, budget: float) -> str:
    """Why a ready target is too busy for this request, in words; empty when it is not."""
    if opt.load > depth:
        return f"{opt.target} has {opt.load} requests in progress or queued (> {depth})"
    if opt.queue_wait > budget:
        return (
            f"{opt.target}'s queue of {opt.queue} jobs takes about {_secs(opt.queue_wait)}, "
            f"over the latency budget of {_secs(budget)}"
        )
    return ""


def decide(ask: Ask, snap: Snapshot, rules: Rules) -> Decision:
    now, depth = snap.now, rules.overflow_queue_depth
    locals_ = snap.locals
    budget = max(0.0, ask.max_wait - ask.waited)
    ready = [opt for opt in locals_ if opt.servable]
    idle = [opt for opt in ready if not _busy(opt, depth, budget)]
    if idle:
        best = min(idle, key=lambda o: o.load)
        reason = "cloud_failed" if ask.cloud_failed else "ready"
        return Decision(Action.LOCAL, reason, f"{best.target} is ready", local=best)

    clouds = [c for c in snap.clouds if c.available]
    cloud = clouds[0] if clouds and not ask.private and not ask.cloud_failed else None
    affordable = cloud if cloud is not None and _fits(cloud.cost, snap.budget_left) else None

    if ready:
        least = min(ready, key=lambda o: (o.load, o.queue_wait))
        busy = _busy(least, depth, budget)
        if affordable is not None:
            return Decision(
                Action.CLOUD, "local_busy", busy, cloud=affordable, queue_depth=least.load
            )
        why = _why_no_cloud(ask, snap, cloud, clouds)
        detail = f"{busy}; local anyway: {why.replace('_', ' ')}"
        return Decision(Action.LOCAL, f"busy_{why}", detail, local=least)

    waits = [(opt.ready_in(now), opt) for opt in locals_]
    startable = [(t, opt) for t, opt in waits if not math.isinf(t)]
    soonest = min(startable, key=lambda pair: pair[0]) if startable else None
    queued = [o for o in locals_ if o.pool_wait and o.wakes and o.held < o.max_held]
    stuck = [o for o in locals_ if o.unschedulable and o.held < o.max_held]
    if soonest is not None and soonest[0] <= budget:
        t, opt = soonest
        reason = (
            "cloud_failed"
            if ask.cloud_failed
            else (
                "starting"
                if opt.phase is Phase.STARTING
                else ("parked_within_budget" if opt.phase is Phase.PARKED else "cold_within_budget")
            )
        )
        detail = f"{opt.target} predicted ready in {_secs(t)} (latency budget {_secs(budget)})"
        return Decision(Action.HOLD, reason, detail, local=opt)

    warm = None
    if soonest is not None and soonest[1].phase is not Phase.STARTING:
        warm = soonest[1].target
    if affordable is not None:
        if soonest is None and queued:
            reason, detail = "pool_busy", f"{queued[0].target}: {queued[0].pool_wait}"
        elif soonest is None and stuck:
            reason = "local_unschedulable"
            detail = f"{stuck[0].target} waits for a free GPU: {stuck[0].unschedulable}"
        elif soonest is None:
            reason = "local_unavailable" if locals_ else "cloud_only"
            detail = "no local target can start now" if locals_ else "the model runs only there"
        else:
            reason = "local_parked" if soonest[1].phase is Phase.PARKED else "local_cold"
            detail = (
                f"{soonest[1].target} predicted ready in {_secs(soonest[0])}, "
                f"over the latency budget of {_secs(budget)}"
            )
        return Decision(
            Action.CLOUD,
            reason,
            detail,
            cloud=affordable,
            warm=warm if rules.warm_on_cloud else None,
        )

    why = _why_no_cloud(ask, snap, cloud, clouds)
    if soonest is None and queued:  # nobody can say how long: held, up to its deadline
        opt = queued[0]
        detail = f"{opt.target}: {opt.pool_wait}; holding: {why.replace('_', ' ')}"
        return Decision(Action.HOLD, why, detail, local=opt)
    if soonest is None and stuck:  # nobody can say when a GPU frees: held, up to its deadline
        opt = stuck[0]
        detail = f"{opt.target} waits for a free GPU ({opt.unschedulable}); holding: {why}"
        return Decision(Action.HOLD, "local_unschedulable", detail.replace("_", " "), local=opt)
    if soonest is None:
        where = "no local target can start now" if locals_ else "the model has no local placement"
        if why == "budget_exhausted":
            detail = f"the daily cloud budget is spent, and {where}"
            return Decision(Action.REJECT, why, detail, status=429)
        if ask.cloud_failed:
            return Decision(Action.REJECT, "cloud_failed", f"the cloud failed; {where}", status=502)
        reason = "local_unavailable" if locals_ else why
        return Decision(Action.REJECT, reason, f"{where} ({why.replace('_', ' ')})", status=503)
    t, opt = soonest
    late = f"{opt.target} predicted ready in {_secs(t)}, over the latency budget of {_secs(budget)}"
    if ask.private and snap.clouds:
        detail = f"private work never leaves the building; {late}"
        return Decision(Action.REJECT, "private_local_late", detail, status=503, warm=opt.target)
    if ask.cloud_failed:
        return Decision(Action.REJECT, "cloud_failed", late, status=502, warm=opt.target)
    reason = "local_only" if not snap.clouds else why
    return Decision(Action.HOLD, reason, f"{late}; holding: {reason.replace('_', ' ')}", local=opt)


def _why_no_cloud(
    ask: Ask, snap: Snapshot, cloud: CloudOption | None, available: list[CloudOption]
) -> str:
    if not snap.clouds:
        return "local_only"
    if ask.private:
        return "private"
    if ask.cloud_failed:
        return "cloud_failed"
    if not available:
        return "cloud_unavailable"
    if cloud is not None and not _fits(cloud.cost, snap.budget_left):
        return "budget_exhausted"
    return "cloud_unavailable"
