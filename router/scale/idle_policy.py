"""``idle_after: auto``: how long to keep an idle target, learned from its own gaps.

A gap is the time from the end of one burst of use to the start of the next. The policy keeps a
histogram of them (log-spaced bins, older gaps fading) and answers the ``idle_after`` that costs
least over the gaps it has seen, as the keep-alive policies of serverless platforms do from the
idle times of each function (the hybrid histogram policy of Shahrad et al., USENIX ATC 2020),
here priced rather than cut at a percentile:

- a gap ``g`` no longer than ``T`` costs the GPU held idle: ``g * gpu``;
- a longer one costs ``T * gpu``, then a cold start: the GPU while it starts, and a person
  waiting for it: ``C * (gpu + wait)``, ``C`` the target's predicted cold start.

``T`` is chosen among the bin edges within ``[lower, upper]``, minimizing the sum: the GPU is
kept while the chance that the next request comes soon is worth what it holds. Until it has seen
:data:`MIN_GAPS` gaps worth deciding on, the answer is the upper bound. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

FIRST_EDGE = 1.0
"""Seconds: the first bin starts here."""
RATIO = 1.08
"""Each bin is 8% wider than the one before: 1 s to a week in about 160 bins."""
BINS = math.ceil(math.log(7 * 86400 / FIRST_EDGE) / math.log(RATIO)) + 1
MIN_GAPS = 8
"""Gaps at least the lower bound long (the only ones that move the answer) seen before the
histogram is trusted; fewer: the upper bound, as a fixed ``idle_after`` would."""
HALF_LIFE = 200.0
"""A gap weighs half as much after this many later ones: the policy follows a changing habit
within weeks, and one odd day does not undo it."""
VERSION = 1


def edge(i: int) -> float:
    """The lower edge of bin ``i`` in seconds."""
    return float(FIRST_EDGE * RATIO**i)


def bin_of(gap: float) -> int:
    if gap < FIRST_EDGE:
        return 0
    return min(BINS - 1, int(math.log(gap / FIRST_EDGE) / math.log(RATIO)))


class IdlePolicy:
    """The histogram of one target's gaps and the ``idle_after`` it implies."""

    def __init__(
        self,
        bounds: tuple[float, float],
        gpu_second_usd: float,
        wait_second_usd: float,
    ) -> None:
        self.lower, self.upper = bounds
        self.gpu = gpu_second_usd
        self.wait = wait_second_usd
        self.counts = [0.0] * BINS
        """Weights per bin, scaled by :attr:`_unit` (older gaps fade by not growing)."""
        self.gaps = 0
        """Gaps seen that were at least the lower bound."""
        self._unit = 1.0
        self._growth = 2.0 ** (1.0 / HALF_LIFE)
        self._answer: tuple[float, float] | None = None
        """(cold start it was computed for, idle_after)."""

    @property
    def learned(self) -> bool:
        """Enough gaps seen: the answer comes from the histogram, not the fallback."""
        return self.gaps >= MIN_GAPS

    def observe(self, gap: float) -> bool:
        """One gap between bursts; ``True`` when it was recorded (shorter than the lower bound:
        within a burst, and no ``idle_after`` in bounds would release across it)."""
        if not math.isfinite(gap) or gap < self.lower:
            return False
        self.counts[bin_of(gap)] += self._unit
        self._unit *= self._growth
        if self._unit > 1e12:  # renormalize long before floats lose precision
            self.counts = [c / self._unit for c in self.counts]
            self._unit = 1.0
        self.gaps += 1
        self._answer = None
        return True

    def idle_after(self, cold_start: float) -> float:
        """Seconds idle before the release, for a target whose cold start takes ``cold_start``."""
        if not self.learned:
            return self.upper
        if self._answer is not None and self._answer[0] == cold_start:
            return self._answer[1]
        best = self._choose(cold_start)
        self._answer = (cold_start, best)
        return best

    def expected_cost(self, keep: float, cold_start: float) -> float:
        """USD over the gaps seen (as weighted) of keeping the target ``keep`` seconds."""
        penalty = cold_start * (self.gpu + self.wait)
        total = 0.0
        for i, weight in enumerate(self.counts):
            if weight:
                gap = _middle(i)
                total += weight * (gap * self.gpu if gap <= keep else keep * self.gpu + penalty)
        return total / self._unit

    def _choose(self, cold_start: float) -> float:
        """The candidate of least cost (on a tie, the shorter: the gaps seen give no reason to
        hold the card longer than it takes to cover them)."""
        candidates = [self.lower, self.upper]
        candidates += [e for i in range(BINS) if self.lower < (e := edge(i + 1)) < self.upper]
        candidates.sort()
        penalty = cold_start * (self.gpu + self.wait)
        # One pass over bins and candidates together: gaps at most the candidate are kept
        # through (their own length), the rest are paid as keep + penalty each.
        mids = [(_middle(i), w) for i, w in enumerate(self.counts) if w]
        weight_above = sum(w for _, w in mids)
        kept_cost = 0.0
        j = 0
        best, best_cost = self.upper, math.inf
        for keep in candidates:
            while j < len(mids) and mids[j][0] <= keep:
                gap, w = mids[j]
                kept_cost += w * gap * self.gpu
                weight_above -= w
                j += 1
            cost = kept_cost + weight_above * (keep * self.gpu + penalty)
            if cost < best_cost * (1 - 1e-12):
                best, best_cost = keep, cost
        return best

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
            counts = [0.0] * BINS
            for key, value in dict(data["bins"]).items():
                i, weight = int(key), float(value)
                if not (0 <= i < BINS) or not math.isfinite(weight) or weight < 0:
                    return False
                counts[i] = weight
            gaps = int(data["gaps"])
        except (KeyError, TypeError, ValueError):
            return False
        self.counts, self._unit, self.gaps, self._answer = counts, 1.0, max(0, gaps), None
        return True

    def describe(self, cold_start: float) -> dict[str, Any]:
        """What ``/targets`` and the dashboard show."""
        return {
            "idle_after": round(self.idle_after(cold_start), 3),
            "learned": self.learned,
            "gaps": self.gaps,
            "gaps_needed": MIN_GAPS,
            "bounds": [self.lower, self.upper],
        }


def _middle(i: int) -> float:
    """A gap in bin ``i``, as the cost counts it: the bin's geometric middle."""
    return float(FIRST_EDGE * RATIO ** (i + 0.5))
