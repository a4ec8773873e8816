"""A target's engine queue as warmgate sees it: its depth as the busy poll last read it (ComfyUI's
``queue_remaining``, Gradio's ``queue_size``, vLLM's ``vllm:num_requests_waiting``), and the time
one job takes there, learned from how fast the queue drains.

The API policy reads both: the depth is the target's load (with warmgate's own API requests),
and depth x time per job is the wait a request would spend in that queue, counted against its
latency budget like a cold start (docs/openai.md). Fed at every busy poll; no I/O here."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Final

from backends.outside import count

SAMPLES: Final = 20
"""Drains remembered; the time per job is their median (one slow render does not make it)."""


class EngineQueue:
    """Learning the time per job: between two polls that found the queue not empty, the time
    passes with work in the engine; each job fewer in the queue is one that left it. Time with
    work over jobs gone is the seconds one job takes to leave the queue (with several running
    side by side, a fraction of one job's length: what a job waiting at the back waits for each
    one ahead of it). Jobs arriving meanwhile hide departures, so it errs long, never short;
    its resolution is the busy poll's."""

    def __init__(self) -> None:
        self.depth = 0
        """Jobs in the engine's queue at the last poll that got an answer (0 before any)."""
        self.samples: deque[float] = deque(maxlen=SAMPLES)
        """Seconds per job of the recent drains, oldest first."""
        self._last: tuple[float, int] | None = None
        """Loop time and depth of the previous answer; ``None`` after a gap."""
        self._busy = 0.0
        """Seconds with work in the queue since the last job left it."""

    def heard(self, depth: int | None, now: float) -> None:
        """One busy poll's answer: the depth it read, or ``None`` (no answer, or the engine
        tells no queue: nothing is learned across the gap, the depth stays)."""
        depth = count(depth)  # the engine's figure: one out of bounds is no answer here too
        if depth is None:
            self._last = None
            return
        if self._last is not None:
            at, before = self._last
            if before > 0:
                self._busy += max(0.0, now - at)
                gone = before - depth
                if gone > 0:
                    self.samples.append(self._busy / gone)
                    self._busy = 0.0
        if depth == 0:
            self._busy = 0.0
        self.depth = depth
        self._last = (now, depth)

    def restart(self) -> None:
        """The engine is ready afresh (a start, a wake): its queue is empty and unread yet; what
        was learned stays."""
        self.depth = 0
        self._last = None
        self._busy = 0.0

    @property
    def job_seconds(self) -> float | None:
        """Seconds one job takes to leave the queue, as learned; ``None`` before any drain."""
        return statistics.median(self.samples) if self.samples else None

    def wait(self) -> float:
        """Seconds a job queued now would wait behind the others: depth x time per job; 0 with
        nothing queued or nothing learned yet (then only ``overflow_queue_depth`` applies)."""
        seconds = self.job_seconds
        if not self.depth or seconds is None or math.isnan(seconds):
            return 0.0
        return self.depth * seconds
