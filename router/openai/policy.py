"""Where one API request runs: a pure function of (request, snapshot of its placements, budget,
rules, now) -> :class:`Decision`. No I/O and no awaits; :mod:`router.openai.api` acts on it.
The snapshot's parts are immutable named tuples: built on every request, they must be cheap.

The policy is :data:`TABLE`: rules of (reason, condition, decision), read in order, the first
that holds decides. The conditions ask :class:`Facts`, worked out once per request. In short
(docs/openai.md has it for people):

- a local target ready and not saturated -> ``local``; saturated is a load (warmgate's own API
  requests, or the engine's own queue where it tells one) over ``overflow_queue_depth``, or a
  predicted wait in that queue (depth x learned time per job) over the latency budget: then the
  cloud when allowed (``local_busy``, the depth in the header), else local anyway;
- local cold, starting or parked and predicted ready within the latency budget -> ``hold`` (a
  parked target is predicted from its learned wake time, a cold one from its cold starts);
- otherwise the cloud when allowed (not private, affordable, configured), warming the local
  target with ``warm_on_cloud``; a start waiting for its GPU pool or unschedulable has no
  known wait: the cloud at once (``pool_busy``, ``local_unschedulable``);
- the cloud not allowed: held for a local target that can start (also when nobody can say how
  long: pool full, unschedulable), else ``reject``: 429 when the budget is spent, 502 after a
  cloud failure, 503 otherwise; private work over the latency budget, on a model with a cloud
  placement -> 503 (the work never leaves the building), the local target started;
- after a cloud failure: local when it can serve within what is left of the latency budget.

Rejections never invite a retry loop: the caller answers them with ``x-should-retry: false``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

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
        return tuple(o for o in self.snap.locals if o.pool_wait and o.wakes and o.held < o.max_held)

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
            f"{target} predicted ready in {_secs(self.soonest_in)}, "
            f"over the latency budget of {_secs(self.budget)}"
        )


class Rule(NamedTuple):
    """One line of the policy's table: when ``when`` holds (and no rule above it did), the
    decision is ``then``'s, with ``reason`` (``<why>`` standing for :attr:`Facts.why`)."""

    reason: str
    when: Callable[[Facts], bool]
    then: Callable[[Facts, str], Decision]

    def reason_for(self, facts: Facts) -> str:
        reason = self.reason
        return reason.replace("<why>", facts.why) if "<" in reason else reason


# -- what each rule decides ---------------------------------------------------------------


def _local_idle(f: Facts, reason: str) -> Decision:
    best = min(f.idle, key=lambda o: o.load)
    return Decision(Action.LOCAL, reason, f"{best.target} is ready", local=best)


def _least_busy(f: Facts) -> LocalOption:
    return min(f.ready, key=lambda o: (o.load, o.queue_wait))


def _cloud_busy(f: Facts, reason: str) -> Decision:
    least = _least_busy(f)
    busy = _busy(least, f.rules.overflow_queue_depth, f.budget)
    return Decision(Action.CLOUD, reason, busy, cloud=f.affordable, queue_depth=least.load)


def _local_anyway(f: Facts, reason: str) -> Decision:
    least = _least_busy(f)
    busy = _busy(least, f.rules.overflow_queue_depth, f.budget)
    detail = f"{busy}; local anyway: {f.why.replace('_', ' ')}"
    return Decision(Action.LOCAL, reason, detail, local=least)


def _hold_soonest(f: Facts, reason: str) -> Decision:
    target = f.soonest.target if f.soonest is not None else "none"
    detail = f"{target} predicted ready in {_secs(f.soonest_in)} (latency budget {_secs(f.budget)})"
    return Decision(Action.HOLD, reason, detail, local=f.soonest)


def _to_cloud(detail: Callable[[Facts], str]) -> Callable[[Facts, str], Decision]:
    """To the affordable cloud, starting the soonest local target with ``warm_on_cloud``
    (unless it is starting already)."""

    def then(f: Facts, reason: str) -> Decision:
        warm = None
        if f.rules.warm_on_cloud and f.soonest is not None and not f.soonest_is(Phase.STARTING):
            warm = f.soonest.target
        return Decision(Action.CLOUD, reason, detail(f), cloud=f.affordable, warm=warm)

    return then


def _hold_queued(f: Facts, reason: str) -> Decision:
    opt = f.queued[0]
    detail = f"{opt.target}: {opt.pool_wait}; holding: {f.why.replace('_', ' ')}"
    return Decision(Action.HOLD, reason, detail, local=opt)


def _hold_stuck(f: Facts, reason: str) -> Decision:
    opt = f.stuck[0]
    detail = f"{opt.target} waits for a free GPU ({opt.unschedulable}); holding: {f.why}"
    return Decision(Action.HOLD, reason, detail.replace("_", " "), local=opt)


def _reject(
    status: int, detail: Callable[[Facts], str], *, warm: bool = False
) -> Callable[[Facts, str], Decision]:
    """An error now; ``warm``: starting the soonest local target for the next request."""

    def then(f: Facts, reason: str) -> Decision:
        start = f.soonest.target if warm and f.soonest is not None else None
        return Decision(Action.REJECT, reason, detail(f), status=status, warm=start)

    return then


def _hold_late(f: Facts, reason: str) -> Decision:
    detail = f"{f.late}; holding: {reason.replace('_', ' ')}"
    return Decision(Action.HOLD, reason, detail, local=f.soonest)


# -- the table: first match wins (docs/openai.md has it for people) ------------------------

TABLE: tuple[Rule, ...] = (
    # a local target ready and not too busy
    Rule("ready", lambda f: bool(f.idle) and not f.ask.cloud_failed, _local_idle),
    Rule("cloud_failed", lambda f: bool(f.idle), _local_idle),
    # every ready one too busy: the cloud when allowed, else local anyway
    Rule("local_busy", lambda f: bool(f.ready) and f.affordable is not None, _cloud_busy),
    Rule("busy_<why>", lambda f: bool(f.ready), _local_anyway),
    # one predicted to serve within the latency budget: held for it
    Rule("cloud_failed", lambda f: f.within_budget and f.ask.cloud_failed, _hold_soonest),
    Rule("starting", lambda f: f.within_budget and f.soonest_is(Phase.STARTING), _hold_soonest),
    Rule(
        "parked_within_budget",
        lambda f: f.within_budget and f.soonest_is(Phase.PARKED),
        _hold_soonest,
    ),
    Rule("cold_within_budget", lambda f: f.within_budget, _hold_soonest),
    # too late or unknown, the cloud allowed and affordable: the cloud
    Rule(
        "pool_busy",
        lambda f: f.affordable is not None and f.none_startable and bool(f.queued),
        _to_cloud(lambda f: f"{f.queued[0].target}: {f.queued[0].pool_wait}"),
    ),
    Rule(
        "local_unschedulable",
        lambda f: f.affordable is not None and f.none_startable and bool(f.stuck),
        _to_cloud(
            lambda f: f"{f.stuck[0].target} waits for a free GPU: {f.stuck[0].unschedulable}"
        ),
    ),
    Rule(
        "local_unavailable",
        lambda f: f.affordable is not None and f.none_startable and bool(f.snap.locals),
        _to_cloud(lambda f: "no local target can start now"),
    ),
    Rule(
        "cloud_only",
        lambda f: f.affordable is not None and f.none_startable,
        _to_cloud(lambda f: "the model runs only there"),
    ),
    Rule(
        "local_parked",
        lambda f: f.affordable is not None and f.soonest_is(Phase.PARKED),
        _to_cloud(lambda f: f.late),
    ),
    Rule("local_cold", lambda f: f.affordable is not None, _to_cloud(lambda f: f.late)),
    # no cloud for it, and nobody can say when a local one serves: held up to the deadline
    Rule("<why>", lambda f: f.none_startable and bool(f.queued), _hold_queued),
    Rule("local_unschedulable", lambda f: f.none_startable and bool(f.stuck), _hold_stuck),
    # no cloud for it, and nothing local can start: an error
    Rule(
        "budget_exhausted",
        lambda f: f.none_startable and f.why == "budget_exhausted",
        _reject(429, lambda f: f"the daily cloud budget is spent, and {f.where}"),
    ),
    Rule(
        "cloud_failed",
        lambda f: f.none_startable and f.ask.cloud_failed,
        _reject(502, lambda f: f"the cloud failed; {f.where}"),
    ),
    Rule(
        "local_unavailable",
        lambda f: f.none_startable and bool(f.snap.locals),
        _reject(503, lambda f: f"{f.where} ({f.why.replace('_', ' ')})"),
    ),
    Rule(
        "<why>",
        lambda f: f.none_startable,
        _reject(503, lambda f: f"{f.where} ({f.why.replace('_', ' ')})"),
    ),
    # no cloud for it, a local one over the latency budget
    Rule(
        "private_local_late",
        lambda f: f.ask.private and bool(f.snap.clouds),
        _reject(503, lambda f: f"private work never leaves the building; {f.late}", warm=True),
    ),
    Rule("cloud_failed", lambda f: f.ask.cloud_failed, _reject(502, lambda f: f.late, warm=True)),
    Rule("<why>", lambda f: True, _hold_late),  # local_only, budget_exhausted, ...
)
"""The policy, in order: the first rule whose ``when`` holds decides."""


def rule_for(facts: Facts) -> Rule:
    """The first rule of :data:`TABLE` that holds (the last always does)."""
    for rule in TABLE:
        if rule.when(facts):
            return rule
    raise AssertionError("the last rule always holds")


def decide(ask: Ask, snap: Snapshot, rules: Rules) -> Decision:
    facts = Facts.of(ask, snap, rules)
    rule = rule_for(facts)
    return rule.then(facts, rule.reason_for(facts))


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
