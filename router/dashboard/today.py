"""What happened today (UTC) and in the last hour, for the operator's view: each target's cold
starts with their durations, its last failure, its GPU-seconds since midnight; each model's
decisions of the last hour.

Fed by the targets' state changes (:meth:`Today.on_state`, called from the event bus) and by
reading warmgate's own counters (:meth:`Today.sample`, every few seconds); nothing on the request
path. Times are wall-clock seconds (epoch), converted from loop time with one offset taken at
start, so that the same state always reads the same.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter

from router.scale.state import Phase, TargetState

HOUR = 3600.0
DECISION_SAMPLE_INTERVAL = 30.0
"""Seconds between two readings of the decisions counter: the hour's window is this coarse."""
MAX_STARTS = 500
"""Cold starts kept per target (today's; a target that starts more often than this a day shows
the latest)."""


def utc_day(epoch: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).date()


@dataclass(slots=True)
class ColdStart:
    at: float
    """Wall-clock time the start began."""
    reason: str
    seconds: float | None = None
    """From scale-up to ready (or to the failure); ``None`` while it runs."""
    outcome: str = "starting"
    """starting, ready, failed or stopped."""

    def to_json(self) -> dict[str, object]:
        return {
            "at": round(self.at, 1),
            "seconds": None if self.seconds is None else round(self.seconds, 1),
            "outcome": self.outcome,
            "reason": self.reason,
        }


@dataclass(slots=True)
class TargetDay:
    starts: deque[ColdStart] = field(default_factory=lambda: deque(maxlen=MAX_STARTS))
    last_failure: tuple[float, str] | None = None
    """(wall-clock time, reason) of the last failed start or lost workload."""


Sample = dict[tuple[str, ...], float]


def read(counter: Counter | None, suffix: str = "_total") -> Sample:
    """A labelled counter's current values by label values (its public ``collect``)."""
    out: Sample = {}
    if counter is None:
        return out
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                out[tuple(sample.labels.values())] = sample.value
    return out


class Today:
    def __init__(
        self,
        targets: Iterable[str],
        loop_now: float,
        gpu_seconds: Counter,
        decisions: Counter | None = None,
        cloud_spend: Counter | None = None,
    ) -> None:
        self.offset = time.time() - loop_now
        """Wall-clock seconds = loop seconds + offset (one offset: the same state reads the
        same, so an unchanged view is recognised as unchanged)."""
        self.targets = {name: TargetDay() for name in targets}
        self.gpu_seconds = gpu_seconds
        self.decisions = decisions
        self.cloud_spend = cloud_spend
        self.day = utc_day(time.time())
        self.gpu_baseline: Sample = {}
        """GPU-seconds counted before today began (zero: warmgate started today)."""
        self.spend_baseline: Sample = {}
        """USD spent per cloud before today began."""
        self.decision_samples: deque[tuple[float, Sample]] = deque(
            [(loop_now, {})], maxlen=int(HOUR / DECISION_SAMPLE_INTERVAL) + 10
        )

    def wall(self, loop_time: float) -> float:
        return loop_time + self.offset

    # -- fed by state changes ------------------------------------------------------------------

    def on_state(self, target: str, old: TargetState, new: TargetState) -> None:
        day = self.targets.get(target)
        if day is None or old.phase is new.phase:
            return
        at = self.wall(new.since)
        if new.phase is Phase.STARTING and old.phase in (Phase.COLD, Phase.FAILED):
            self._roll()
            day.starts.append(ColdStart(at, new.reason))
        elif old.phase is Phase.STARTING and day.starts and day.starts[-1].seconds is None:
            start = day.starts[-1]
            start.seconds = max(0.0, at - start.at)
            start.outcome = {Phase.READY: "ready", Phase.FAILED: "failed"}.get(new.phase, "stopped")
        if new.phase is Phase.FAILED or (
            new.phase is Phase.COLD and old.phase is Phase.READY
        ):  # a failed start, or the workload died under it
            day.last_failure = (at, new.reason)

    # -- fed by warmgate's counters ------------------------------------------------------------

    def sample(self, loop_now: float) -> None:
        """The day's rollover and a reading of the decisions (at most every 30 s)."""
        self._roll()
        if loop_now - self.decision_samples[-1][0] >= DECISION_SAMPLE_INTERVAL:
            self.decision_samples.append((loop_now, read(self.decisions)))

    def _roll(self) -> None:
        today = utc_day(time.time())
        if today != self.day:
            self.day = today
            self.gpu_baseline = read(self.gpu_seconds)
            self.spend_baseline = read(self.cloud_spend)

    # -- what the view reads -------------------------------------------------------------------

    def starts_today(self, target: str) -> list[ColdStart]:
        self._roll()
        day = self.targets[target]
        return [start for start in day.starts if utc_day(start.at) == self.day]

    def last_failure(self, target: str) -> tuple[float, str] | None:
        return self.targets[target].last_failure

    def gpu_seconds_today(self) -> Mapping[str, dict[str, float]]:
        """Target -> state (busy, idle; parked where it exists) -> seconds since midnight UTC."""
        self._roll()
        out: dict[str, dict[str, float]] = {}
        for (target, state), value in read(self.gpu_seconds).items():
            before = self.gpu_baseline.get((target, state), 0.0)
            out.setdefault(target, {})[state] = round(max(0.0, value - before), 1)
        return out

    def cloud_spend_today(self) -> dict[str, float]:
        """Cloud -> USD this replica spent since midnight UTC."""
        self._roll()
        return {
            cloud: round(max(0.0, value - self.spend_baseline.get((cloud,), 0.0)), 4)
            for (cloud,), value in read(self.cloud_spend).items()
        }

    def decisions_last_hour(self, loop_now: float) -> dict[str, list[dict[str, object]]]:
        """Model -> [{placement, reason, count}], most frequent first."""
        since = next(
            (s for t, s in self.decision_samples if t >= loop_now - HOUR),
            self.decision_samples[-1][1],
        )
        counts: dict[str, list[tuple[int, str, str]]] = {}
        for (model, placement, reason), value in read(self.decisions).items():
            count = round(value - since.get((model, placement, reason), 0.0))
            if count > 0:
                counts.setdefault(model, []).append((count, placement, reason))
        return {
            model: [
                {"placement": placement, "reason": reason, "count": count}
                for count, placement, reason in sorted(rows, key=lambda r: (-r[0], r[1], r[2]))
            ]
            for model, rows in counts.items()
        }
