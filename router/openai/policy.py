"""Where one API request runs: a pure function of (request, snapshot of its placements, budget,
rules, now) -> :class:`Decision`. No I/O and no awaits; :mod:`router.openai.api` acts on it.
What it knows of the request and its placements is :mod:`router.openai.facts`.

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
from collections.abc import Callable
from typing import NamedTuple

from router.openai.facts import Ask, CloudOption, Facts, LocalOption, Rules, Snapshot, secs
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
    busy = f.busy(least)
    return Decision(Action.CLOUD, reason, busy, cloud=f.affordable, queue_depth=least.load)


def _local_anyway(f: Facts, reason: str) -> Decision:
    least = _least_busy(f)
    busy = f.busy(least)
    detail = f"{busy}; local anyway: {f.why.replace('_', ' ')}"
    return Decision(Action.LOCAL, reason, detail, local=least)


def _hold_soonest(f: Facts, reason: str) -> Decision:
    target = f.soonest.target if f.soonest is not None else "none"
    detail = f"{target} predicted ready in {secs(f.soonest_in)} (latency budget {secs(f.budget)})"
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
