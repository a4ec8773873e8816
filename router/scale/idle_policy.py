"""``idle_after: auto`` and ``park_after: auto``: how long to keep an idle target, learned from
its own gaps.

A gap is the time from the end of one burst of use to the start of the next. The policy keeps a
histogram of them (log-spaced bins, older gaps fading), as the keep-alive policies of serverless
platforms do from the idle times of each function (the hybrid histogram policy of Shahrad et al.,
USENIX ATC 2020). Where that policy cuts the histogram at percentiles (keep alive to the 99th,
pre-warm from the 5th), this one prices each candidate window against the gaps seen, at
``economics:``'s prices, and keeps the cheapest:

- a gap ``g`` no longer than the park window ``P`` costs the GPU held idle: ``g * gpu``;
- one between ``P`` and the idle window ``S`` costs ``P`` of GPU, the rest parked, then a wake:
  the GPU while it loads and the people waiting for it, ``W * (gpu + wait * waiters)``;
- a longer one costs ``P`` of GPU, ``S - P`` parked, then a cold start ``C * (gpu + wait *
  waiters)``.

Without the parked tier ``P = S``. A learned ``S`` is kept :data:`MARGIN` longer than the
cheapest. Until it has seen :data:`MIN_GAPS` gaps worth deciding on, ``S`` is the upper bound
and ``P`` the lower one (a wake costs seconds, a cold start minutes).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from backends.outside import count, number

FIRST_EDGE = 1.0
"""Seconds: the first bin starts here."""
RATIO = 1.08
"""Each bin is 8% wider than the one before: 1 s to a week in about 160 bins."""
BINS = math.ceil(math.log(7 * 86400 / FIRST_EDGE) / math.log(RATIO)) + 1
MIN_GAPS = 1
"""Gaps at least the lower bound long (the only ones that move the answer) seen before the
histogram is trusted; fewer: the upper bound, as a fixed ``idle_after`` would. One: each gap
spent at the upper bound may hold the card an hour for nothing, while a wrong early answer costs
a cold start or two and corrects itself with the gaps that follow (they are seen whatever the
answer). On the generated traces (three shapes, three seeds each) the first gaps at the upper
bound are most of what ``auto`` costs over the best fixed value: with one (and the margin
below), auto stays within 6% of it on all nine; with two, one is 10.3% over; with three, four
are over 10%."""
MARGIN = 1.1
"""A learned ``idle_after`` is this much longer than the cheapest window over the gaps seen
(except the lower bound: no gap is near it there). The cheapest sits just past a bin of gaps,
and the next gap of the same habit is a few seconds longer as often as shorter. 10% keeps the
hobby traces' sessions (a render every 1-3 minutes) from a cold start each, at a tenth of the
window in the gaps it releases in."""
HALF_LIFE = 200.0
"""A gap weighs half as much after this many later ones: the policy follows a changing habit
within weeks, and one odd day does not undo it."""
WAITS_FADE = 0.95
"""Each start weighs this much less than the next in what waiting costs (about twenty
remembered)."""
VERSION = 1


def edge(i: int) -> float:
    """The lower edge of bin ``i`` in seconds."""
    return float(FIRST_EDGE * RATIO**i)


def bin_of(gap: float) -> int:
    if gap < FIRST_EDGE:
        return 0
    return min(BINS - 1, int(math.log(gap / FIRST_EDGE) / math.log(RATIO)))


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per second: the GPU held with the weights on it, held parked, and a person waiting."""

    gpu: float
    wait: float
    parked: float = 0.0


@dataclass(frozen=True, slots=True)
class Ask:
    """What is decided: the start and wake it would cost, and what the config fixes."""

    cold_start: float
    wake: float = 2.0
    parks: bool = False
    """The target has the parked tier (``park_after`` set, an engine that parks)."""
    idle_after: float | None = None
    """Fixed by the config; ``None``: learned."""
    park_after: float | None = None
    """Fixed by the config; ``None``: learned (where it parks)."""
    waiters: float = 1.0
    """Seconds people waited per second of a start or a wake (several people, or a page and
    its renders, meet one start): what a second of it costs in waiting."""


@dataclass(frozen=True, slots=True)
class Windows:
    idle_after: float
    park_after: float
    """0: never parked for idleness (no parked tier, or not worth it before ``idle_after``)."""


class Waits:
    """Seconds people waited per second of a start or a wake, learned: a start that three
    people meet after lunch costs three waits. Held requests count their wait; a person on the
    waiting page from the page load to the end of the start. Fades by :data:`WAITS_FADE` per
    start; one person (1.0) before any start was seen."""

    def __init__(self) -> None:
        self.started = 0.0
        self.waited = 0.0
        self.pages: list[float] = []
        """Loop times of page loads that got the waiting page, since the last start ended."""

    def page(self, at: float) -> None:
        """A person got the waiting page at loop time ``at``."""
        if len(self.pages) < 1000:
            self.pages.append(at)

    def start(self, seconds: float, now: float, limit: float = math.inf) -> None:
        """A start (or a wake) that took ``seconds`` ended at ``now``; the people on the waiting
        page waited until now (a page older than ``limit`` was left)."""
        self.started = self.started * WAITS_FADE + max(0.0, seconds)
        self.waited *= WAITS_FADE
        self.waited += sum(now - at for at in self.pages if 0 <= now - at <= limit)
        self.pages.clear()

    def wait(self, seconds: float) -> None:
        """A held request waited ``seconds`` for a start (or a wake)."""
        self.waited += max(0.0, seconds)

    @property
    def waiters(self) -> float:
        if self.started <= 0.0:
            return 1.0
        return round(self.waited / self.started, 2)  # steady between waits: answers are kept


def choose(
    gaps: list[tuple[float, float]], ask: Ask, prices: Prices, bounds: tuple[float, float]
) -> Windows:
    """The windows of least cost over ``gaps`` ((seconds, weight), ascending): one pass of
    prefix sums, then every (park, idle) candidate in O(1). On a tie the shorter windows."""
    lower, upper = bounds
    candidates = sorted(
        {lower, upper} | {e for i in range(BINS) if lower < (e := edge(i + 1)) < upper}
    )
    idles = candidates if ask.idle_after is None else [ask.idle_after]
    if not ask.parks:
        parks: list[float] = []
    elif ask.park_after is not None:
        parks = [ask.park_after]
    else:
        parks = candidates
    points = sorted(set(idles) | set(parks))
    weight_to, gap_to = _prefix(gaps, points)
    total = weight_to[math.inf]
    gpu, parked = prices.gpu, prices.parked
    cold = ask.cold_start * (gpu + prices.wait * ask.waiters)
    wake = ask.wake * (gpu + prices.wait * ask.waiters)
    best, best_cost = Windows(idles[-1], 0.0), math.inf
    for s in idles:
        w_s, g_s = weight_to[s], gap_to[s]
        beyond = total - w_s
        options = [(s, 0.0)] + [(p, p) for p in parks if p < s]  # (P, what park_after says)
        for p, shown in options:
            w_p, g_p = weight_to[p], gap_to[p]
            cost = (
                gpu * g_p
                + (w_s - w_p) * (p * (gpu - parked) + wake)
                + parked * (g_s - g_p)
                + beyond * (p * (gpu - parked) + s * parked + cold)
            )
            if cost < best_cost * (1 - 1e-12):
                best, best_cost = Windows(s, shown), cost
    return best


def _prefix(
    gaps: list[tuple[float, float]], points: list[float]
) -> tuple[dict[float, float], dict[float, float]]:
    """Weight and weighted length of the gaps no longer than each point (and in all: ``inf``)."""
    weight_to: dict[float, float] = {}
    gap_to: dict[float, float] = {}
    weight = length = 0.0
    j = 0
    for point in [*points, math.inf]:
        while j < len(gaps) and gaps[j][0] <= point:
            weight += gaps[j][1]
            length += gaps[j][1] * gaps[j][0]
            j += 1
        weight_to[point], gap_to[point] = weight, length
    return weight_to, gap_to


class IdlePolicy:
    """The histogram of one target's gaps and the windows it implies."""

    def __init__(
        self,
        bounds: tuple[float, float],
        gpu_second_usd: float,
        wait_second_usd: float,
        parked_second_usd: float = 0.0,
    ) -> None:
        self.lower, self.upper = bounds
        self.prices = Prices(gpu_second_usd, wait_second_usd, parked_second_usd)
        self.counts = [0.0] * BINS
        """Weights per bin, scaled by :attr:`_unit` (older gaps fade by not growing)."""
        self.gaps = 0
        """Gaps seen that were at least the lower bound."""
        self._unit = 1.0
        self._growth = 2.0 ** (1.0 / HALF_LIFE)
        self._answers: dict[Ask, Windows] = {}

    @property
    def learned(self) -> bool:
        """Enough gaps seen: the answer comes from the histogram, not the fallback."""
        return self.gaps >= MIN_GAPS

    def observe(self, gap: float) -> bool:
        """One gap between bursts; ``True`` when it was recorded (shorter than the lower bound:
        within a burst, and no window in bounds would release across it)."""
        if not math.isfinite(gap) or gap < self.lower:
            return False
        self.counts[bin_of(gap)] += self._unit
        self._unit *= self._growth
        if self._unit > 1e12:  # renormalize long before floats lose precision
            self.counts = [c / self._unit for c in self.counts]
            self._unit = 1.0
        self.gaps += 1
        self._answers.clear()
        return True

    def windows(self, ask: Ask) -> Windows:
        """``idle_after`` and ``park_after`` for the next idle period."""
        if not self.learned:
            idle = self.upper if ask.idle_after is None else ask.idle_after
            park = 0.0
            if ask.parks:
                park = self.lower if ask.park_after is None else ask.park_after
            return Windows(idle, park if park < idle else 0.0)
        answer = self._answers.get(ask)
        if answer is None:
            answer = choose(list(self._histogram()), ask, self.prices, (self.lower, self.upper))
            if ask.idle_after is None and answer.idle_after > self.lower:
                answer = Windows(min(self.upper, answer.idle_after * MARGIN), answer.park_after)
            if len(self._answers) > 64:  # predictions move with every start: keep a few
                self._answers.clear()
            self._answers[ask] = answer
        return answer

    def idle_after(self, cold_start: float) -> float:
        """Seconds idle before the release of a target without the parked tier, for which one
        person waits through a cold start of ``cold_start`` seconds."""
        return self.windows(Ask(cold_start)).idle_after

    def _histogram(self) -> Iterator[tuple[float, float]]:
        """(gap, weight) ascending, a gap counted at its bin's geometric middle."""
        for i, weight in enumerate(self.counts):
            if weight:
                yield _middle(i), weight

    def expected_cost(self, keep: float, cold_start: float) -> float:
        """USD over the gaps seen (as weighted) of keeping the target ``keep`` seconds, without
        the parked tier, one person waiting through each cold start."""
        gpu = self.prices.gpu
        penalty = cold_start * (gpu + self.prices.wait)
        total = 0.0
        for gap, weight in self._histogram():
            total += weight * (gap * gpu if gap <= keep else keep * gpu + penalty)
        return total / self._unit

    # -- persisted with the target's other learned values ---------------------------------

    def to_json(self) -> dict[str, Any]:
        scale = self._unit
        return {
            "version": VERSION,
            "ratio": RATIO,
            "gaps": self.gaps,
            "bins": {str(i): round(c / scale, 9) for i, c in enumerate(self.counts) if c},
        }

    def load_json(self, data: Mapping[str, Any]) -> bool:
        """Restore what :meth:`to_json` wrote; ``False`` (and nothing changed) for anything
        else (another version, another bin layout, a damaged file)."""
        try:
            if data.get("version") != VERSION or data.get("ratio") != RATIO:
                return False
            counts = _bins(data["bins"])
        except (KeyError, TypeError, ValueError):
            return False
        gaps = count(data.get("gaps"))  # 1e400 or a 401-digit integer: no count
        if gaps is None:
            return False
        self.counts, self._unit, self.gaps = counts, 1.0, gaps
        self._answers.clear()
        return True

    def describe(self, ask: Ask | float) -> dict[str, Any]:
        """What ``/targets`` and the dashboard show: the windows in force and what they were
        learned from (a number: the cold start of a target without the parked tier)."""
        if not isinstance(ask, Ask):
            ask = Ask(float(ask))
        windows = self.windows(ask)
        out: dict[str, Any] = {
            "idle_after": round(windows.idle_after, 3),
            "learned": self.learned,
            "gaps": self.gaps,
            "gaps_needed": MIN_GAPS,
            "bounds": [self.lower, self.upper],
            "cold_start": round(ask.cold_start, 3),
            "waiters": round(ask.waiters, 3),
        }
        if ask.parks:
            out["park_after"] = round(windows.park_after, 3)
            out["wake"] = round(ask.wake, 3)
        return out


MOST_WEIGHT = 1e12
"""A bin's kept weight at most (a count of gaps, decayed): more was not written by warmgate, and
the cost sums over the bins must stay finite."""


def _bins(data: Any) -> list[float]:
    counts = [0.0] * BINS
    if not isinstance(data, dict):
        raise TypeError("bins: expected an object")
    for key, value in data.items():
        i, weight = int(key), number(value, 0.0, MOST_WEIGHT)
        if not (0 <= i < BINS) or weight is None:
            raise ValueError("bad bin")
        counts[i] = weight
    return counts


def _middle(i: int) -> float:
    """A gap in bin ``i``, as the cost counts it: the bin's geometric middle."""
    return float(FIRST_EDGE * RATIO ** (i + 0.5))
