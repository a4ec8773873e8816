"""What a wake from parked is expected to take, learned from one target's recent wakes (the
engine's reload from host memory or page cache, and its warm-up): read by the policy, the
waiting page and the dashboard. Pure."""

from __future__ import annotations

import statistics
from collections import deque

HISTORY = 20
"""Recent wakes remembered."""
EXPECTED_WAKE = 2.0
"""Seconds expected before the first wake is seen: about a second to reload 8 GiB of weights on
the card this is meant for, and a probe or two. Learned from the first wake on."""


class Wakes:
    def __init__(self, expected: float = EXPECTED_WAKE) -> None:
        self.expected = expected
        self.history: deque[float] = deque(maxlen=HISTORY)
        """Seconds from parked to ready of the recent wakes, newest last."""
        self._predicted = expected

    def record(self, seconds: float) -> None:
        """Learn from one wake: the median of the recent ones, nudged up by their spread,
        never less than the last (as cold starts are learned)."""
        self.history.append(max(0.0, seconds))
        values = list(self.history)
        spread = statistics.pstdev(values) if len(values) > 1 else 0.0
        self._predicted = max(values[-1], statistics.median(values) + spread)

    def predicted(self) -> float:
        """Expected seconds from a wake's start to ready."""
        return self._predicted

    @property
    def learned(self) -> bool:
        return bool(self.history)
