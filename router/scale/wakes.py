"""What a wake from parked is expected to take, learned from one target's recent wakes (the
engine's reload from host memory or page cache, and its warm-up): read by the policy, the
waiting page and the dashboard. Pure; the document it keeps (``wake``) survives restarts, as
the cold starts' does."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from router.scale.eta import kept_seconds, predict

HISTORY = 20
"""Recent wakes remembered."""
EXPECTED_WAKE = 2.0
"""Seconds expected before the first wake is seen: about a second to reload 8 GiB of weights on
the card this is meant for, and a probe or two. Learned from the first wake on."""
DOCUMENT_VERSION = 1


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
        self._predicted = predict(self.history)

    def predicted(self) -> float:
        """Expected seconds from a wake's start to ready."""
        return self._predicted

    @property
    def learned(self) -> bool:
        return bool(self.history)

    # -- the document that survives restarts ---------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"version": DOCUMENT_VERSION, "wakes": list(self.history)}  # whole floats

    def load(self, document: Mapping[str, Any]) -> bool:
        """Take the wakes a stored document remembers; ``False`` (nothing taken: relearned)
        when it is not one this version reads, or its seconds are not finite numbers."""
        if document.get("version") != DOCUMENT_VERSION:
            return False
        wakes = kept_seconds(document.get("wakes"))
        if wakes is None:
            return False
        self.history = deque(wakes[-HISTORY:], maxlen=HISTORY)
        self._predicted = predict(self.history) if self.history else self.expected
        return True
