"""Every phase change of a target, as data, and the one code that makes them.

:data:`ROWS` holds each change as a row: (phase, event) -> the next phase and what the change
sets (the stop under way, the park or the wake, the failures counted, the snapshot to go back
to); :data:`TABLE` is the same rows' next phases alone. An event is something that happened to
the target or a step :func:`router.scale.scaling.decide` took; what each decided step does
around its events (the backend's scale-up, the engine's park, the fences of the other
replicas) is :mod:`router.scale.steps`. :meth:`Machine.apply` is the only writer of a target's
state cell: it looks the row up, refuses a change the table does not hold, builds the new
snapshot from the row and what the caller reports (the backend's endpoints, a start's stage,
the words of a failure), logs a phase change and sets the phase gauge. Outside asks (an
operator, the leader's fence, a pool that needs room) never write: they arrive as fields of the
view, and ``decide`` turns them into steps (h11's rule: everything that affects the state
machine lives here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from backends.outside import one_line
from router.config import Scaling
from router.metrics import Metrics
from router.scale.scaling import backoff
from router.scale.state import Phase, StateCell, TargetState

log = logging.getLogger("warmgate.lifecycle")


class Event(enum.Enum):
    START = "start"
    """A start asked of the backend (or of KEDA, through its scaler)."""
    ADOPT = "adopt"
    """The workload runs though nobody here started it (found after a restart, or KEDA keeps
    it): probed like a start."""
    STAGE = "stage"
    """The start moved on to another stage (or its message or load progress changed)."""
    READY = "ready"
    """The engine says its weights are resident, at a ready endpoint."""
    FOUND_PARKED = "found parked"
    """An adopted workload's engine says it is parked."""
    RESTART = "restart"
    """The workload exited during its start, never ready, with requests held: started again
    at once (``scaling.start_retries``), the start's clock going on."""
    FAIL = "fail"
    """The start failed (or a park or wake that this replica may not turn into a stop)."""
    ABANDON = "abandon"
    """A start nobody waits for any more, stopped."""
    LOST = "lost"
    """The workload died, or was taken away (by the leader, by KEDA)."""
    ENDPOINTS = "endpoints"
    """The ready endpoints changed, some are left."""
    NO_ENDPOINT = "no endpoint"
    """No ready endpoint is left: waiting for a replacement, probed like a start."""
    DRAIN = "drain"
    """Idle long enough (or released by an operator): a last look at the engine, then the stop."""
    COMMIT = "commit"
    """The last look found it idle: from here new requests wait for the next start."""
    PUT_OFF = "put off"
    """The drain or the park does not happen: back to the phase it began in."""
    RELEASED = "released"
    """The stop is made: the GPU is free."""
    RELEASE_FAILED = "release failed"
    """The stop could not be made: serving again once probed ready."""
    FENCE = "fence"
    """The leader of the replicas is releasing it: new requests wait meanwhile."""
    UNFENCE = "unfence"
    """The leader's release did not come (or was called off): serving again."""
    UNFENCE_PARKED = "unfence parked"
    """The leader parked it: parked here too."""
    PARK = "park"
    """The engine is asked to drop its weights (they are still on the GPU)."""
    PARKED = "parked"
    """The engine dropped its weights: its process or pod holds no model."""
    WAKE = "wake"
    """The parked engine loads its weights again: probed like a start."""
    WOKE = "woke"
    """The woken engine answers its readiness probe."""
    STOP = "stop"
    """A park or wake failed: stopped instead."""
    QUEUE = "queue"
    """A start or wake waits for room in its GPU pool (or no longer does)."""


BACK: Final = "back"
"""A row's next phase that is the phase the drain or park under way began in."""


class Count(enum.Enum):
    """A value a row sets that depends on the snapshot it changes."""

    ONE_MORE = "one more"
    """The field's count so far, plus one (the failures in a row, the restarts of a start)."""
    BACKOFF = "backoff"
    """Loop time after the backoff that the failures in a row (as set) call for."""
    NEW_STAGE = "new stage"
    """Now when the reported stage differs from the snapshot's, else its ``stage_since``."""


@dataclass(frozen=True, slots=True)
class Row:
    next: Phase | str
    """The next phase, or :data:`BACK`."""
    sets: Mapping[str, object] = field(default_factory=dict)
    """Fields of :class:`TargetState` the change sets (a value, or a :class:`Count`); they win
    over what the caller reports."""
    in_place: bool = False
    """The change stays within its phase: the snapshot's ``since`` stays."""
    saves: bool = False
    """The snapshot changed from is kept (``back_to``) for a :data:`BACK` row."""
    says: str = "reason"
    """The field the event's reason goes to."""
    unready: Event | None = None
    """Rows to ``ready``: the event taken instead when no endpoint is left (a pod gone while its
    probe ran): never ready without one, every request would fail. ``None``: nothing changes."""


def to(phase: Phase | str, *, unready: Event | None = None, **sets: object) -> Row:
    return Row(phase, sets, unready=unready)


def here(phase: Phase, *, says: str = "reason", **sets: object) -> Row:
    return Row(phase, sets, in_place=True, says=says)


def saving(phase: Phase, **sets: object) -> Row:
    return Row(phase, sets, saves=True)


_C, _S, _R, _D, _F, _P = (
    Phase.COLD,
    Phase.STARTING,
    Phase.READY,
    Phase.DRAINING,
    Phase.FAILED,
    Phase.PARKED,
)
_NONE: Final = ()

ROWS: Final[Mapping[tuple[Phase, Event], Row]] = {
    (_C, Event.START): to(_S, endpoints=_NONE, waiting_for=""),
    (_F, Event.START): to(_S, endpoints=_NONE, waiting_for=""),
    (_C, Event.ADOPT): to(_S),
    (_D, Event.ADOPT): to(_S),  # KEDA kept (or brought back) the replica it was scaling down
    (_S, Event.STAGE): here(_S, stage_since=Count.NEW_STAGE),
    (_S, Event.RESTART): here(  # a stage belongs to one try
        _S, endpoints=_NONE, restarts=Count.ONE_MORE, stage=None, stage_message="", progress=None
    ),
    (_S, Event.READY): to(_R, failures=0),
    (_S, Event.FOUND_PARKED): to(_P),
    (_S, Event.FAIL): to(_F, endpoints=_NONE, failures=Count.ONE_MORE, retry_at=Count.BACKOFF),
    (_P, Event.FAIL): to(_F, endpoints=_NONE, failures=Count.ONE_MORE, retry_at=Count.BACKOFF),
    (_S, Event.ABANDON): to(_C, endpoints=_NONE),
    (_R, Event.LOST): to(_C, endpoints=_NONE),
    (_D, Event.LOST): to(_C, endpoints=_NONE),
    (_P, Event.LOST): to(_C, endpoints=_NONE),
    (_R, Event.ENDPOINTS): here(_R),
    (_P, Event.ENDPOINTS): here(_P),
    (_R, Event.NO_ENDPOINT): to(_S, endpoints=_NONE),
    (_P, Event.NO_ENDPOINT): to(_S, endpoints=_NONE),
    (_D, Event.NO_ENDPOINT): to(_S, endpoints=_NONE),  # a fence ends with the pod gone meanwhile
    (_S, Event.NO_ENDPOINT): to(_S, endpoints=_NONE),
    (_R, Event.DRAIN): saving(_D),
    (_P, Event.DRAIN): saving(_D, stopping=True),  # held from the start: it serves nothing
    (_F, Event.DRAIN): saving(_D),  # the workload outlived a failed start
    (_D, Event.COMMIT): to(_D, stopping=True),
    (_D, Event.PUT_OFF): to(BACK),
    (_P, Event.PUT_OFF): to(BACK),
    (_D, Event.RELEASED): to(_C, endpoints=_NONE),
    (_D, Event.RELEASE_FAILED): to(_S),
    (_R, Event.FENCE): to(_D, stopping=True),
    (_P, Event.FENCE): to(_D, stopping=True),
    (_D, Event.UNFENCE): to(_R, unready=Event.NO_ENDPOINT),
    (_D, Event.UNFENCE_PARKED): to(_P),
    (_R, Event.PARK): saving(_P, parking=True),
    (_P, Event.PARKED): to(_P, parking=False),
    (_P, Event.WAKE): to(_P, waking=True, waiting_for=""),
    (_P, Event.WOKE): to(_R, failures=0, unready=Event.NO_ENDPOINT),
    (_P, Event.STOP): to(_D, stopping=True),
    (_C, Event.QUEUE): here(_C, says="waiting_for"),
    (_F, Event.QUEUE): here(_F, says="waiting_for"),
    (_P, Event.QUEUE): here(_P, says="waiting_for"),
}
"""(phase, event) -> the row of the change. A pair not here is a defect, raised."""

TABLE: Final[Mapping[tuple[Phase, Event], Phase | str]] = {
    key: row.next for key, row in ROWS.items()
}
"""(phase, event) -> next phase, or :data:`BACK`: the rows' phases alone (docs/architecture.md)."""

REPORTED: Final = frozenset({"endpoints", "stage", "stage_message", "progress", "told"})
"""What a caller may pass besides the event and its reason: what the backend or the engine
reported. The rest (the stop, the park, the wake, the counts) is the rows'."""

BELONGS: Final[Mapping[str, tuple[Phase, object]]] = {
    "stopping": (_D, False),  # a stop belongs to one drain
    "told": (_F, ""),  # the words of one failure
    "restarts": (_S, 0),  # the tries of one start
    "parking": (_P, False),
    "waking": (_P, False),
}
"""A field that belongs to one phase: cleared by every change to another (or going back)."""

NO_ENDPOINT_YET: Final = "no ready endpoint; waiting for one"


class InvalidTransition(RuntimeError):
    """A change the table does not hold (a defect: the decision and the table disagree)."""


class Machine:
    """One target's state cell, written here only."""

    def __init__(
        self,
        name: str,
        cell: StateCell,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        scaling: Scaling,
    ) -> None:
        self.name = name
        self.cell = cell
        self._loop = loop
        self._scaling = scaling
        """Its ``failure_backoff``: the ``retry_at`` a failure sets."""
        self._gauges = {phase: metrics.target_phase.labels(name, phase.value) for phase in Phase}
        self._show(cell.current.phase)

    def _show(self, current: Phase) -> None:
        for phase, gauge in self._gauges.items():
            gauge.set(1 if phase is current else 0)

    @property
    def state(self) -> TargetState:
        return self.cell.current

    def apply(self, event: Event, reason: str | None = None, **reported: object) -> TargetState:
        """The change ``event`` makes to the current snapshot, by its row, with ``reason`` and
        what was ``reported`` (:data:`REPORTED`); published whole, and returned."""
        old, now = self.cell.current, self._loop.time()
        row = ROWS.get((old.phase, event))
        if row is None:
            raise InvalidTransition(f"{self.name}: no {event.value!r} in phase {old.phase.value}")
        if not reported.keys() <= REPORTED:
            odd = ", ".join(sorted(reported.keys() - REPORTED))
            raise TypeError(f"{event.value}: {odd} is the table's to set, not a caller's")
        new = self._changed(old, row, now, reason, reported)
        if new.phase is Phase.READY and not new.endpoints:
            log.warning("%s: ready without an endpoint; waiting for one", self.name)
            if row.unready is None:
                return old
            new = self._changed(old, ROWS[(old.phase, row.unready)], now, NO_ENDPOINT_YET, {})
        self.cell.replace(new)
        if old.phase is not new.phase:
            log.info("%s: %s -> %s (%s)", self.name, old.phase.value, new.phase.value, new.reason)
            self._show(new.phase)
        return new

    def _changed(
        self,
        old: TargetState,
        row: Row,
        now: float,
        reason: str | None,
        reported: Mapping[str, object],
    ) -> TargetState:
        changes = dict(reported)
        for said in ("stage_message", "told"):  # the state carries outside words as one line
            text = changes.get(said)
            if isinstance(text, str) and text:
                changes[said] = one_line(text)
        # The backoff last: it reads the failure count the row sets, wherever the row names it.
        for name, value in sorted(row.sets.items(), key=lambda kv: kv[1] is Count.BACKOFF):
            changes[name] = self._value(old, name, value, changes, now)
        if reason is not None:
            changes[row.says] = one_line(reason)
        for name, (phase, cleared) in BELONGS.items():
            if row.next is not phase:
                changes.setdefault(name, cleared)
        if row.saves:
            changes["back_to"] = old
        if row.next == BACK:  # as it was, with the endpoints of now
            back_to = old.back_to
            assert back_to is not None, f"{self.name}: {BACK} with nothing to go back to"
            changes.setdefault("endpoints", old.endpoints)
            new = dataclasses.replace(back_to, **changes)  # type: ignore[arg-type]
        elif row.in_place:
            new = dataclasses.replace(old, **changes)  # type: ignore[arg-type]
        else:
            assert isinstance(row.next, Phase)
            new = old.with_phase(row.next, now, **changes)
        under_way = new.phase is Phase.DRAINING or (new.phase is Phase.PARKED and new.parking)
        if new.back_to is not None and not under_way:  # the drain or park is over
            new = dataclasses.replace(new, back_to=None)
        return new

    def _value(
        self, old: TargetState, name: str, value: object, changes: Mapping[str, object], now: float
    ) -> object:
        if value is Count.ONE_MORE:
            count = getattr(old, name)
            assert isinstance(count, int)
            return count + 1
        if value is Count.BACKOFF:
            failures = changes.get("failures", old.failures)
            assert isinstance(failures, int)
            return now + backoff(failures, self._scaling)
        if value is Count.NEW_STAGE:
            return now if changes.get("stage", old.stage) != old.stage else old.stage_since
        return value


def rows() -> list[tuple[str, str, str]]:
    """The table as (phase, event, next phase) in its own order: docs/architecture.md."""
    return [
        (phase.value, event.value, nxt if isinstance(nxt, str) else nxt.value)
        for (phase, event), nxt in TABLE.items()
    ]
