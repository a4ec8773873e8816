"""What a cold start of one target is expected to take: before any start, the config's
``scaling.expected_cold_start``; after, learned from the recent starts, whole and per stage
(docs/operations.md). Pure: the lifecycle records, the waiting page, the policy and the
dashboard read; the document it keeps (``cold-start``) survives restarts.

Time spent ``unschedulable`` (waiting for a GPU that other work holds) is not part of what a
start takes: it is learned from nothing, and a start in that stage has no ETA at all.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

from backends.base import STAGES, Stage
from backends.outside import number

HISTORY = 20
"""Recent starts remembered; older ones have stopped saying much (images and models change)."""
UNKNOWN: frozenset[str] = frozenset({"unschedulable"})
"""Stages whose end nobody can predict: the GPU comes free when other work ends."""
DOCUMENT_VERSION = 1


def predict(history: deque[float] | list[float]) -> float:
    """The median of the recent ones, nudged up by their spread, never less than the last."""
    values = list(history)
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return max(values[-1], statistics.median(values) + spread)


class ColdStarts:
    """Recent cold starts of one target: seconds from scale-up to ready (time spent
    unschedulable left out), and seconds per stage (0 for a stage a start went without)."""

    def __init__(self, expected: float) -> None:
        self.expected = expected
        """Seconds, before any start was seen (``scaling.expected_cold_start``)."""
        self.history: deque[float] = deque(maxlen=HISTORY)
        """Seconds of the recent starts, newest last."""
        self.stages: dict[str, deque[float]] = {}
        """Seconds per stage of the recent starts that had stages, newest last."""
        self._cache: tuple[int, float, float] | None = None

    @property
    def learned(self) -> bool:
        return bool(self.history)

    def record(self, seconds: float, stages: Mapping[str, float] | None = None) -> None:
        """One finished start: its total and, where the backend told, its time per stage."""
        self.history.append(max(0.0, seconds))
        if stages:
            for stage in STAGES:
                if stage in UNKNOWN:
                    continue
                times = self.stages.setdefault(stage, deque(maxlen=HISTORY))
                times.append(max(0.0, stages.get(stage, 0.0)))

    def predicted(self) -> float:
        """Expected seconds from scale-up to ready."""
        history = self.history
        if not history:
            return self.expected
        key = (len(history), history[-1])
        if self._cache is None or self._cache[:2] != key:
            self._cache = (*key, predict(history))
        return self._cache[2]

    def stage_predicted(self, stage: str) -> float | None:
        """Expected seconds in ``stage``; ``None`` before a start with stages was seen, or for
        a stage with no foreseeable end."""
        times = self.stages.get(stage)
        return predict(times) if times and stage not in UNKNOWN else None

    def remaining(self, stage: Stage | None, in_stage: float, elapsed: float) -> float | None:
        """Expected seconds until ready for a start ``elapsed`` seconds in (time unschedulable
        left out), ``in_stage`` seconds into ``stage``; ``None``: nobody can tell (no GPU is
        free). Per stage where the stages were learned, else from the whole."""
        if stage in UNKNOWN:
            return None
        by_stage = self.left_by_stage(stage, in_stage)
        if by_stage:
            return sum(seconds for _, seconds in by_stage)
        return max(0.0, self.predicted() - elapsed)

    def left_by_stage(self, stage: Stage | None, in_stage: float) -> list[tuple[Stage, float]]:
        """What is left of a start ``in_stage`` seconds into ``stage``, stage by stage, in
        order: the rest of this one, then each later one a start takes time in; empty where
        the stages were not learned (or no end can be foreseen)."""
        if stage is None or self.stage_predicted(stage) is None:
            return []
        left = [(stage, max(0.0, (self.stage_predicted(stage) or 0.0) - in_stage))]
        for later in STAGES[STAGES.index(stage) + 1 :]:
            seconds = self.stage_predicted(later) or 0.0
            if seconds > 0.0:
                left.append((later, seconds))
        return left

    def describe(self) -> dict[str, Any]:
        """For ``/targets`` and the dashboard."""
        return {
            "eta": round(self.predicted(), 2),
            "learned_from": len(self.history),
            "by_stage": {
                stage: round(value, 2)
                for stage in STAGES
                if (value := self.stage_predicted(stage)) is not None
            },
        }

    # -- the document that survives restarts ---------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {  # whole floats (JSON keeps them exactly): the same ETA after a restart
            "version": DOCUMENT_VERSION,
            "starts": list(self.history),
            "stages": {k: list(v) for k, v in self.stages.items() if v},
        }

    def restore(self, document: Mapping[str, Any]) -> bool:
        """Take the starts a stored document remembers; ``False`` (nothing taken) when it is
        not one this version reads."""
        if document.get("version") != DOCUMENT_VERSION:
            return False
        starts = kept_seconds(document.get("starts"))
        stages = document.get("stages")
        if starts is None or not isinstance(stages, Mapping):
            return False
        by_stage = {str(k): kept_seconds(v) for k, v in stages.items() if k in STAGES}
        if any(v is None for v in by_stage.values()):
            return False
        self.history = deque(starts, maxlen=HISTORY)
        self.stages = {k: deque(v or (), maxlen=HISTORY) for k, v in by_stage.items()}
        self._cache = None
        return True


MOST_KEPT: Final = 86_400.0
"""Seconds: no start or wake warmgate learned takes a day (``cold_start_timeout`` ends one long
before); a kept figure above it was not written by warmgate (the document also lives in a
Deployment annotation, which whoever may annotate it controls)."""


def kept_seconds(value: object) -> list[float] | None:
    """The last :data:`HISTORY` seconds of a kept list; ``None`` when it is no list of finite
    numbers within a day (a document this version does not read: relearned)."""
    if not isinstance(value, list):
        return None
    out = []
    for item in value[-HISTORY:]:
        seconds = number(item, hi=MOST_KEPT)  # a 401-digit integer too: no float holds it
        if seconds is None:
            return None
        out.append(max(0.0, seconds))
    return out
