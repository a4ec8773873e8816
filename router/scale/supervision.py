"""A target's lifecycle never dies: each turn of its loop runs under a :class:`Supervisor`. An
unexpected exception in any step is logged at ERROR with its traceback (once for its kind),
counted (``warmgate_lifecycle_errors_total{target,step}``), shown on the target (``/targets``,
the dashboard), and the loop goes on after a short backoff that grows while the step keeps
failing. An idle GPU is still given back when one step of the loop breaks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from typing import Final

from backends.outside import one_line
from router.metrics import Metrics

log = logging.getLogger("warmgate.lifecycle")

BACKOFF_FIRST: Final = 1.0
"""Seconds before the loop's next turn after its first failure: short, so a one-off bad answer
costs a GPU one second of idle time."""

BACKOFF_MOST: Final = 30.0
"""The longest wait between turns of a loop that keeps failing (doubling from the first): the
target is still looked at twice a minute, and a log is not flooded."""


@dataclasses.dataclass(frozen=True)
class LoopError:
    """The last failure of a target's loop, as ``/targets`` and the dashboard show it."""

    step: str
    error: str
    """One line: the exception's type and its words (they may carry outside text)."""
    at: float
    """Wall-clock time (epoch seconds) of the latest failure."""
    repeats: int
    """Failures in a row, this one included."""

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "error": self.error,
            "at": round(self.at, 1),
            "repeats": self.repeats,
        }


class Supervisor:
    """Watches one target's loop: whether it runs, and how its last failure went."""

    def __init__(self, target: str, metrics: Metrics) -> None:
        self.target = target
        self.metrics = metrics
        self.task: asyncio.Task[None] | None = None
        self.last_error: LoopError | None = None
        """Kept after the loop recovers (the dashboard shows when it last failed)."""
        self._failing: dict[str, int] = {}
        """Failures of each step since it last went through."""
        self._logged: set[tuple[str, str]] = set()
        """(step, exception type) already logged with a traceback: later ones are counted and
        shown, not logged again (a failure that comes back each minute floods no log)."""

    @property
    def running(self) -> bool:
        """The loop is alive (an always-on target has none, and needs none)."""
        return self.task is not None and not self.task.done()

    def failed(self, step: str, exc: BaseException) -> float:
        """One turn failed in ``step``: counted, remembered, and logged with its traceback the
        first time this step fails so; returns the seconds to wait before the next turn."""
        self.metrics.lifecycle_errors.labels(self.target, step).inc()
        error = one_line(f"{type(exc).__name__}: {exc}")
        repeats = self._failing.get(step, 0) + 1
        self._failing[step] = repeats
        self.last_error = LoopError(step, error, time.time(), repeats)
        kind = (step, type(exc).__name__)
        if kind not in self._logged:  # the traceback's frames are warmgate's own lines
            self._logged.add(kind)
            frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
            log.error(
                "%s: the lifecycle's %s step failed: %s\n%s", self.target, step, error, frames
            )
        return min(BACKOFF_MOST, BACKOFF_FIRST * 2.0 ** min(repeats - 1, 16))

    def succeeded(self, *steps: str) -> None:
        """A turn went through these steps: their next failure is news again."""
        for step in steps:
            repeats = self._failing.pop(step, 0)
            if repeats:
                log.info(
                    "%s: the lifecycle's %s step went through after %d failure(s)",
                    self.target,
                    step,
                    repeats,
                )
