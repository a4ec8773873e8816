"""Time to first token per model, as the API path measures it: from the request's arrival to
the first body bytes of its answer (streamed or not; a cold start waited through counts, it is
what the client waited), local and cloud apart. p50 and p95 over the last :data:`WINDOW`
seconds, at most :data:`MAX_SAMPLES` answers each."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

WINDOW = 24 * 3600.0
"""Seconds of answers the percentiles are taken over: the dashboard's day."""
MAX_SAMPLES = 2000
"""Answers kept per model and placement (the latest)."""


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..1) of sorted ``values``."""
    rank = max(1, math.ceil(q * len(values)))
    return values[rank - 1]


class FirstTokens:
    def __init__(self, clock: Callable[[], float]) -> None:
        """``clock``: loop time (the same as a call's ``started``)."""
        self.clock = clock
        self.samples: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        """(model, local|cloud) -> (loop time, seconds), oldest first."""

    def record(self, model: str, where: str, seconds: float) -> None:
        kept = self.samples.setdefault((model, where), deque(maxlen=MAX_SAMPLES))
        kept.append((self.clock(), max(0.0, seconds)))

    def describe(self, model: str) -> dict[str, Any] | None:
        """``{local|cloud: {p50, p95, n}}`` over the window; ``None`` before the first answer."""
        since = self.clock() - WINDOW
        out: dict[str, Any] = {}
        for where in ("local", "cloud"):
            kept = self.samples.get((model, where))
            if kept is None:
                continue
            while kept and kept[0][0] < since:
                kept.popleft()
            values = sorted(seconds for _, seconds in kept)
            if values:
                out[where] = {
                    "p50": round(percentile(values, 0.5), 3),
                    "p95": round(percentile(values, 0.95), 3),
                    "n": len(values),
                }
        return out or None
