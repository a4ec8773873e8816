"""One target's day as a strip of phases: when it was cold, starting (by stage), ready and busy,
ready and idle, parked, draining or failed, and the moments requests met a cold start or a wake.

It records at the one place a phase changes: it follows the target's state cell (every change
:meth:`router.scale.machine.Machine.apply` makes), and is sampled for what a state change does
not carry (ready busy or ready idle: activity). It never writes state. Times are wall-clock
epoch seconds, so that the day survives a restart: the strip is kept in the target's state
store (``timeline``), written at most every :data:`KEEP_EVERY` seconds and at the end; a gap
while warmgate was not running reads ``unknown``. Bounded: :data:`WINDOW` of history, at most
:data:`MAX_SEGMENTS` changes and :data:`MAX_MARKS` marks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from backends.base import STAGES
from backends.documents import StateStore
from backends.outside import count, number
from router.scale.persist import Writer, read_back
from router.scale.state import Phase, TargetState

log = logging.getLogger("warmgate.lifecycle")

KEY = "timeline"
"""The key the strip is kept under in the target's state store."""
WINDOW = 24 * 3600.0
"""Seconds of history kept (and drawn): the day."""
MAX_SEGMENTS = 1500
"""Changes kept at most (a target that flaps more often than this a day shows the latest)."""
MAX_MARKS = 500
"""Cold starts and wakes met by requests kept at most."""
KEEP_EVERY = 60.0
"""Seconds between two writes of the strip (a crash loses at most this much of it)."""
UNKNOWN = "unknown"
"""The label of a time warmgate was not running (between the last write and a restart)."""

LABELS = ("cold", "starting", "busy", "idle", "parked", "draining", "failed", UNKNOWN)
"""The strip's labels; ``starting`` carries its stage as ``starting:<stage>``."""


def label_of(state: TargetState, busy: bool) -> str:
    """What the strip calls ``state``: its phase, the stage of a start, busy or idle when
    ready; a wake from parked is a start (its weights are loading)."""
    phase = state.phase
    if phase is Phase.STARTING:
        return f"starting:{state.stage}" if state.stage else "starting"
    if phase is Phase.READY:
        return "busy" if busy else "idle"
    if phase is Phase.PARKED and state.waking:
        return "starting:waking"
    return str(phase.value)


def family(label: str) -> str:
    """``starting:pulling`` -> ``starting``; the others are their own."""
    return label.split(":", 1)[0]


def _outcome(mark: Mapping[str, Any]) -> str | None:
    """A kept mark's outcome (a mark kept before outcomes were: ready if it has seconds)."""
    outcome = mark.get("outcome")
    if outcome in ("ready", "failed", "stopped"):
        return str(outcome)
    return "ready" if mark.get("seconds") is not None else None


@dataclass(slots=True)
class Mark:
    at: float
    """Wall-clock time requests met it."""
    kind: str
    """``cold start`` or ``wake``."""
    held: int
    """Requests held when it began."""
    seconds: float | None = None
    """Until ready (``None``: not ready yet, or it did not end ready)."""
    outcome: str | None = None
    """``ready``; ``failed`` (the start or wake failed: the requests waited that long for a
    503); ``stopped`` (abandoned or released first); ``None`` while under way."""
    ended: float | None = None
    """Seconds until it ended other than ready (``failed``, ``stopped``)."""

    def to_json(self) -> dict[str, Any]:
        seconds = None if self.seconds is None else round(self.seconds, 1)
        out = {"at": round(self.at, 1), "kind": self.kind, "held": self.held, "seconds": seconds}
        if self.outcome is not None:
            out["outcome"] = self.outcome
        if self.ended is not None:
            out["ended"] = round(self.ended, 1)
        return out

    @property
    def waited(self) -> float | None:
        """Seconds the requests that met it waited, however it ended; ``None`` while it runs
        or when it was stopped."""
        if self.outcome == "failed":
            return self.ended
        return self.seconds


class Timeline:
    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        busy: Callable[[], bool],
        held: Callable[[], int],
    ) -> None:
        """``busy``: the target has work now (activity); ``held``: requests held now."""
        self.name = name
        self.loop = loop
        self.busy = busy
        self.held = held
        self.offset = time.time() - loop.time()
        """Wall-clock seconds = loop seconds + offset."""
        self.segments: deque[tuple[float, str]] = deque(maxlen=MAX_SEGMENTS)
        """(wall-clock start, label), oldest first; each lasts until the next (the last: now)."""
        self.marks: deque[Mark] = deque(maxlen=MAX_MARKS)
        self.store: StateStore | None = None
        """Where the strip survives a restart (set by the wiring; ``None``: forgotten)."""
        self._writer: Writer | None = None
        self._kept_at = -math.inf
        self._dirty = False
        self._state: TargetState | None = None

    def wall(self, loop_time: float) -> float:
        return loop_time + self.offset

    def now(self) -> float:
        """Wall-clock seconds, read through the loop (tests fast-forward it)."""
        return self.wall(self.loop.time())

    # -- recording -----------------------------------------------------------------------------

    def on_state(self, old: TargetState, new: TargetState) -> None:
        """A state cell's listener: never raises into the machine that applied the change."""
        try:
            self._on_state(old, new)
        except Exception:
            log.exception("%s: recording the timeline failed", self.name)

    def _on_state(self, old: TargetState, new: TargetState) -> None:
        self._state = new
        now = self.now()
        at = self.wall(new.since) if new.phase is not old.phase else now
        self._add(min(at, now), label_of(new, self.busy()))
        began_start = new.phase is Phase.STARTING and old.phase in (Phase.COLD, Phase.FAILED)
        began_wake = new.phase is Phase.PARKED and new.waking and not old.waking
        if began_start or began_wake:
            self.marks.append(Mark(now, "cold start" if began_start else "wake", self.held()))
        else:
            self._settle(old, new, now)
        self._keep(now)

    def _settle(self, old: TargetState, new: TargetState, now: float) -> None:
        """The end of the start or wake the last mark is of: ready, failed or stopped."""
        last = self.marks[-1] if self.marks else None
        if last is None or last.outcome is not None:
            return
        if new.phase is Phase.READY and old.phase in (Phase.STARTING, Phase.PARKED):
            last.seconds, last.outcome = max(0.0, now - last.at), "ready"
            return
        ended_start = old.phase is Phase.STARTING and new.phase is not Phase.STARTING
        ended_wake = old.phase is Phase.PARKED and old.waking and not new.waking
        if ended_start or ended_wake:
            last.ended = max(0.0, now - last.at)
            last.outcome = "failed" if new.phase is Phase.FAILED else "stopped"

    def sample(self, state: TargetState) -> None:
        """What a change of state does not tell (busy or idle): looked at every few seconds."""
        self._state = state
        now = self.now()
        self._add(now, label_of(state, self.busy()))
        self._keep(now)

    def _add(self, at: float, label: str) -> None:
        segments = self.segments
        if segments:
            last_at, last_label = segments[-1]
            if last_label == label:
                return
            at = max(at, last_at)
            if at == last_at:  # a change in the same instant replaces it
                segments.pop()
                if segments and segments[-1][1] == label:
                    self._dirty = True
                    return
        segments.append((at, label))
        self._dirty = True
        self._prune(at)

    def _prune(self, now: float) -> None:
        """Forget what ended before the window (the segment that spans its start stays)."""
        start = now - WINDOW
        segments = self.segments
        while len(segments) > 1 and segments[1][0] <= start:
            segments.popleft()
        while self.marks and self.marks[0].at < start:
            self.marks.popleft()

    # -- reading -------------------------------------------------------------------------------

    def spans(self, since: float, until: float) -> Iterator[tuple[float, float, str]]:
        """(start, end, label) clipped to [since, until], oldest first."""
        segments = list(self.segments)
        for i, (at, label) in enumerate(segments):
            end = segments[i + 1][0] if i + 1 < len(segments) else until
            start, end = max(at, since), min(end, until)
            if end > start:
                yield start, end, label

    def seconds(self, since: float, until: float) -> dict[str, float]:
        """Seconds per label family (``starting`` whole) in [since, until]."""
        out: dict[str, float] = {}
        for start, end, label in self.spans(since, until):
            key = family(label)
            out[key] = out.get(key, 0.0) + end - start
        return out

    def waits(self, since: float) -> list[float]:
        """Seconds of each cold start or wake met by requests since ``since`` that ended ready."""
        return [m.seconds for m in self.marks if m.at >= since and m.seconds is not None]

    def waits_by_kind(self, since: float) -> dict[str, list[float]]:
        """Seconds requests waited since ``since``: for a ``cold start`` or a ``wake`` that
        ended ready, or for one that ``failed`` (a 503 at the end of the wait)."""
        out: dict[str, list[float]] = {"cold start": [], "wake": [], "failed": []}
        for m in self.marks:
            waited = m.waited
            if m.at >= since and waited is not None:
                out["failed" if m.outcome == "failed" else m.kind].append(waited)
        return out

    def to_json(self, since: float | None = None) -> dict[str, Any]:
        """The strip (from ``since``; default: the whole window) and its marks."""
        first = -math.inf if since is None else since
        segments = [
            [round(max(start, first), 1), label] for start, _, label in self._kept_spans(first)
        ]
        marks = [m.to_json() for m in self.marks if m.at >= first]
        return {"segments": segments, "marks": marks}

    def _kept_spans(self, since: float) -> Iterator[tuple[float, float, str]]:
        segments = list(self.segments)
        for i, (at, label) in enumerate(segments):
            end = segments[i + 1][0] if i + 1 < len(segments) else math.inf
            if end > since:
                yield at, end, label

    # -- what survives a restart ---------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        return {"v": 1, "until": round(self.now(), 1), **self.to_json()}

    def restore(self, document: Mapping[str, Any]) -> bool:
        """Take the strip a previous run kept (before anything recorded here); ``False`` (and
        nothing taken) for a document of another form or with a value out of range. Clamped to
        now: what a clock ahead of this one wrote (a segment, a mark, its ``until``) is not
        drawn in the future. The time from its last write until now reads ``unknown``."""
        now = self.now()
        taken = _taken(document, now)
        if taken is None:
            return False
        until, segments, marks = taken
        mine = list(self.segments)
        self.segments.clear()
        for at, label in sorted(segments):
            if at <= now:
                self.segments.append((at, label))
        if self.segments and until < now:
            self._add(until, UNKNOWN)
        self.marks.extendleft(reversed([m for m in sorted(marks, key=_at) if m.at <= now]))
        for at, label in mine:
            self._add(max(at, until), label)
        self._prune(now)
        return True

    async def open(self) -> None:
        """Read back the kept strip (a bad document: a warning, ignored) and keep it from now
        on."""
        store = self.store
        if store is None:
            return
        if await read_back(store, KEY, self.restore, "the timeline", self.name):
            log.info(
                "%s: the timeline since %s remembered from %s",
                self.name,
                time.strftime("%H:%M:%S", time.gmtime(self.segments[0][0]))
                if self.segments
                else "-",
                store.where,
            )
        self._writer = Writer(store, KEY)
        self._keep(self.now(), force=True)

    def _keep(self, now: float, force: bool = False) -> None:
        if self._writer is None or not self._dirty:
            return
        if force or now - self._kept_at >= KEEP_EVERY:
            self._kept_at = now
            self._dirty = False
            self._writer.put(self.record())

    async def close(self) -> None:
        """The strip as it is is written (bounded), nothing after."""
        if self._writer is not None:
            self._dirty = True
            self._keep(self.now(), force=True)
            await self._writer.close()
            self._writer = None


_KINDS = ("cold start", "wake")
_STARTING = frozenset(f"starting:{stage}" for stage in (*STAGES, "waking"))


def _label(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return value if value in LABELS or value in _STARTING else None


def _at(mark: Mark) -> float:
    return mark.at


def _taken(
    document: Mapping[str, Any], now: float
) -> tuple[float, list[tuple[float, str]], list[Mark]] | None:
    """(until, segments, marks) of a kept strip, each number through :mod:`backends.outside`
    (wall-clock times after 1970 and not after ``now``; the kept ``until`` clamped to now);
    ``None`` for anything else."""
    if count(document.get("v")) != 1:
        return None
    until = number(document.get("until"), 0.0)
    raw_segments, raw_marks = document.get("segments"), document.get("marks", [])
    if until is None or not isinstance(raw_segments, list) or not isinstance(raw_marks, list):
        return None
    segments = []
    for item in raw_segments:
        if not isinstance(item, list) or len(item) != 2:
            return None
        at, label = number(item[0], 0.0), _label(item[1])
        if at is None or label is None:
            return None
        segments.append((at, label))
    marks = []
    for item in raw_marks:
        if not isinstance(item, dict) or item.get("kind") not in _KINDS:
            return None
        at, held = number(item.get("at"), 0.0), count(item.get("held"))
        seconds = item.get("seconds")
        waited = None if seconds is None else number(seconds, 0.0, WINDOW)
        ended = item.get("ended")
        over = None if ended is None else number(ended, 0.0, WINDOW)
        if at is None or held is None or (seconds is not None and waited is None):
            return None
        if ended is not None and over is None:
            return None
        marks.append(Mark(at, str(item["kind"]), held, waited, _outcome(item), over))
    return min(until, now), segments, marks
