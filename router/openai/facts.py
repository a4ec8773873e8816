"""What the policy knows when it places one API request (:mod:`router.openai.policy` decides
on it): the request (:class:`Ask`), a snapshot of its model's placements as they are now
(:class:`LocalOption`, :class:`CloudOption`, :class:`Snapshot`), the operator's rules
(:class:`Rules`), and :class:`Facts`, what the rules ask about them, worked out once per request.
The snapshot's parts are immutable named tuples: built on every request, they must be cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from router.scale.state import Phase


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
    may_start: bool = True
    """Whether a request like this one may start the target."""
    wake: float = 2.0
    """Predicted seconds from parked to ready, learned from this target's wakes."""
    waking: bool = False
    """Parked, and its wake began at ``since``."""
    pool_wait: str = ""
    """Its GPU pool is full and nothing in it may be displaced yet: what it waits for. How long
    is unknown (``ready_in`` is ``inf``; :func:`router.openai.policy.decide` tells it from a
    target that cannot start)."""
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
            return self.wake if self.may_start else math.inf
        if not self.may_start or (phase is Phase.FAILED and now < self.retry_at):
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


def _fits(cost: float, left: float) -> bool:
    """Whether a cost fits what is left, with slack for float sums (as the budget allows)."""
    return cost <= left + 1e-9


def secs(value: float) -> str:
    """Seconds in words, for a decision's detail: ``12s``, or ``never``."""
    return "never" if math.isinf(value) else f"{value:.0f}s"


def _busy(opt: LocalOption, depth: int, budget: float) -> str:
    """Why a ready target is too busy for this request, in words; empty when it is not."""
    if opt.load > depth:
        return f"{opt.target} has {opt.load} requests in progress or queued (> {depth})"
    if opt.queue_wait > budget:
        return (
            f"{opt.target}'s queue of {opt.queue} jobs takes about {secs(opt.queue_wait)}, "
            f"over the latency budget of {secs(budget)}"
        )
    return ""


_T = TypeVar("_T")


class _once(Generic[_T]):
    """A fact worked out on first use and kept in the instance (functools.cached_property
    without its lock: the policy runs on one loop, on every API request)."""

    def __init__(self, compute: Callable[[Facts], _T]) -> None:
        self.compute = compute
        self.name = compute.__name__

    def __get__(self, facts: Facts, owner: type | None = None) -> _T:
        value = self.compute(facts)
        facts.__dict__[self.name] = value  # from now on read without this descriptor
        return value


class Facts:
    """What the rules ask about one request, worked out from (ask, snapshot, rules) when a rule
    first asks, and once: the common case (a ready target) asks little."""

    def __init__(self, ask: Ask, snap: Snapshot, rules: Rules) -> None:
        self.ask = ask
        self.snap = snap
        self.rules = rules
        self.budget = max(0.0, ask.max_wait - ask.waited)
        """Seconds of the latency budget left (``max_wait`` less what was already waited)."""

    @classmethod
    def of(cls, ask: Ask, snap: Snapshot, rules: Rules) -> Facts:
        return cls(ask, snap, rules)

    @_once
    def ready(self) -> tuple[LocalOption, ...]:
        """Local targets that serve at once."""
        return tuple(opt for opt in self.snap.locals if opt.servable)

    @_once
    def idle(self) -> tuple[LocalOption, ...]:
        """Of those, the ones not too busy for this request."""
        depth, budget = self.rules.overflow_queue_depth, self.budget
        return tuple(opt for opt in self.ready if not _busy(opt, depth, budget))

    @_once
    def _clouds(self) -> list[CloudOption]:
        return [c for c in self.snap.clouds if c.available]

    @_once
    def cloud(self) -> CloudOption | None:
        """The cloud this request may go to (configured, not private, not after a cloud
        failure), affordable or not."""
        clouds, ask = self._clouds, self.ask
        return clouds[0] if clouds and not ask.private and not ask.cloud_failed else None

    @_once
    def affordable(self) -> CloudOption | None:
        """That cloud, where the day's budget still covers this request."""
        cloud = self.cloud
        return cloud if cloud is not None and _fits(cloud.cost, self.snap.budget_left) else None

    @_once
    def _soonest(self) -> tuple[float, LocalOption] | None:
        now = self.snap.now
        waits = [(opt.ready_in(now), opt) for opt in self.snap.locals]
        startable = [(t, opt) for t, opt in waits if not math.isinf(t)]
        return min(startable, key=lambda pair: pair[0]) if startable else None

    @_once
    def soonest(self) -> LocalOption | None:
        """The local target predicted to serve first, among those that can start now."""
        soonest = self._soonest
        return None if soonest is None else soonest[1]

    @_once
    def soonest_in(self) -> float:
        """Its predicted seconds until it serves (``inf`` when there is none)."""
        soonest = self._soonest
        return math.inf if soonest is None else soonest[0]

    @_once
    def queued(self) -> tuple[LocalOption, ...]:
        """Waiting for their GPU pool with nothing to displace (the wait is unknown),
        holdable."""
        return tuple(
            o for o in self.snap.locals if o.pool_wait and o.may_start and o.held < o.max_held
        )

    @_once
    def stuck(self) -> tuple[LocalOption, ...]:
        """Starting but unschedulable (no GPU free in the cluster), holdable."""
        return tuple(o for o in self.snap.locals if o.unschedulable and o.held < o.max_held)

    @_once
    def why(self) -> str:
        """Why the cloud is not for this request: ``local_only``, ``private``,
        ``cloud_failed``, ``cloud_unavailable`` or ``budget_exhausted`` (meaningless while
        it is)."""
        return _why_no_cloud(self.ask, self.snap, self.cloud, self._clouds)

    @_once
    def within_budget(self) -> bool:
        """A local target is predicted to serve within the latency budget."""
        return self.soonest is not None and self.soonest_in <= self.budget

    def busy(self, opt: LocalOption) -> str:
        """Why the ready target ``opt`` is too busy for this request, in words; empty when it
        is not."""
        return _busy(opt, self.rules.overflow_queue_depth, self.budget)

    def soonest_is(self, phase: Phase) -> bool:
        return self.soonest is not None and self.soonest.phase is phase

    @property
    def none_startable(self) -> bool:
        """No local target can be predicted to serve (none, or none can start now)."""
        return self.soonest is None

    @property
    def where(self) -> str:
        """Why nothing local helps, in words, for a rejection."""
        if self.snap.locals:
            return "no local target can start now"
        return "the model has no local placement"

    @property
    def late(self) -> str:
        """The soonest local target's prediction against the budget, in words."""
        target = self.soonest.target if self.soonest is not None else "none"
        return (
            f"{target} predicted ready in {secs(self.soonest_in)}, "
            f"over the latency budget of {secs(self.budget)}"
        )


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
