"""Every phase change of a target, as data, and the one code that makes them.

:data:`TABLE` holds each change as a row: (phase, event) -> the next phase. An event is
something that happened to the target or a step :func:`router.scale.scaling.decide` took;
what each decided step does around its events (the backend's scale-up, the engine's park, the
fences of the other replicas) is :mod:`router.scale.steps`. :meth:`Machine.apply` is the only
writer of a target's state cell: it looks the row up, refuses a change the table does not
hold, builds the new snapshot, logs a phase change and sets the phase gauge. Outside asks (an
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
from typing import Final

from backends.outside import one_line
from router.metrics import Metrics
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

_C, _S, _R, _D, _F, _P = (
    Phase.COLD,
    Phase.STARTING,
    Phase.READY,
    Phase.DRAINING,
    Phase.FAILED,
    Phase.PARKED,
)

TABLE: Final[Mapping[tuple[Phase, Event], Phase | str]] = {
    (_C, Event.START): _S,
    (_F, Event.START): _S,
    (_C, Event.ADOPT): _S,
    (_D, Event.ADOPT): _S,  # KEDA kept (or brought back) the replica it was scaling down
    (_S, Event.STAGE): _S,
    (_S, Event.RESTART): _S,
    (_S, Event.READY): _R,
    (_S, Event.FOUND_PARKED): _P,
    (_S, Event.FAIL): _F,
    (_P, Event.FAIL): _F,
    (_S, Event.ABANDON): _C,
    (_R, Event.LOST): _C,
    (_D, Event.LOST): _C,
    (_P, Event.LOST): _C,
    (_R, Event.ENDPOINTS): _R,
    (_P, Event.ENDPOINTS): _P,
    (_R, Event.NO_ENDPOINT): _S,
    (_P, Event.NO_ENDPOINT): _S,
    (_D, Event.NO_ENDPOINT): _S,  # a fence ends with the pod gone meanwhile
    (_S, Event.NO_ENDPOINT): _S,
    (_R, Event.DRAIN): _D,
    (_P, Event.DRAIN): _D,
    (_F, Event.DRAIN): _D,  # the workload outlived a failed start
    (_D, Event.COMMIT): _D,
    (_D, Event.PUT_OFF): BACK,
    (_P, Event.PUT_OFF): BACK,
    (_D, Event.RELEASED): _C,
    (_D, Event.RELEASE_FAILED): _S,
    (_R, Event.FENCE): _D,
    (_P, Event.FENCE): _D,
    (_D, Event.UNFENCE): _R,
    (_D, Event.UNFENCE_PARKED): _P,
    (_R, Event.PARK): _P,
    (_P, Event.PARKED): _P,
    (_P, Event.WAKE): _P,
    (_P, Event.WOKE): _R,
    (_P, Event.STOP): _D,
    (_C, Event.QUEUE): _C,
    (_F, Event.QUEUE): _F,
    (_P, Event.QUEUE): _P,
}
"""(phase, event) -> next phase, or :data:`BACK`. A pair not here is a defect, raised."""

IN_PLACE: Final = frozenset({Event.STAGE, Event.RESTART, Event.ENDPOINTS, Event.QUEUE})
"""Events that change a snapshot's fields within its phase: its ``since`` stays."""


class InvalidTransition(RuntimeError):
    """A change the table does not hold (a defect: the decision and the table disagree)."""


class Machine:
    """One target's state cell, written here only."""

    def __init__(
        self, name: str, cell: StateCell, loop: asyncio.AbstractEventLoop, metrics: Metrics
    ) -> None:
        self.name = name
        self.cell = cell
        self._loop = loop
        self._gauges = {phase: metrics.target_phase.labels(name, phase.value) for phase in Phase}
        self.before: TargetState | None = None
        """The snapshot a drain or park under way began from (:data:`BACK` returns to it)."""
        self._show(cell.current.phase)

    def _show(self, current: Phase) -> None:
        for phase, gauge in self._gauges.items():
            gauge.set(1 if phase is current else 0)

    @property
    def state(self) -> TargetState:
        return self.cell.current

    def apply(self, event: Event, reason: str | None = None, **changes: object) -> TargetState:
        """The change ``event`` makes to the current snapshot, with ``reason`` and ``changes``
        (fields of :class:`TargetState`); published whole, and returned."""
        old, now = self.cell.current, self._loop.time()
        row = TABLE.get((old.phase, event))
        if row is None:
            raise InvalidTransition(f"{self.name}: no {event.value!r} in phase {old.phase.value}")
        if reason is not None:
            changes["reason"] = one_line(reason)
        for said in ("stage_message", "told"):  # the state carries outside words as one line
            text = changes.get(said)
            if isinstance(text, str) and text:
                changes[said] = one_line(text)
        if event in (Event.DRAIN, Event.PARK):
            self.before = old
        if row is not Phase.DRAINING:
            changes.setdefault("stopping", False)  # a stop belongs to one drain
        if row is not Phase.FAILED:
            changes.setdefault("told", "")  # the words of one failure
        if row is not Phase.STARTING:
            changes.setdefault("restarts", 0)  # the tries of one start
        if row is not Phase.PARKED:
            changes.setdefault("parking", False)
            changes.setdefault("waking", False)
        if row == BACK:  # as it was, with the endpoints of now
            before = self.before
            assert before is not None, f"{self.name}: {event.value} with nothing to go back to"
            changes.setdefault("endpoints", old.endpoints)
            new = dataclasses.replace(before, **changes)  # type: ignore[arg-type]
        elif event in IN_PLACE:
            new = dataclasses.replace(old, **changes)  # type: ignore[arg-type]
        else:
            assert isinstance(row, Phase)
            new = old.with_phase(row, now, **changes)
        if new.phase is Phase.READY and not new.endpoints:
            # Never ready without an endpoint (a pod gone while its probe ran): every request
            # would fail. Starting, probed again once the backend reports one.
            log.warning("%s: ready without an endpoint; waiting for one", self.name)
            if old.phase is Phase.STARTING:
                return old
            new = old.with_phase(
                Phase.STARTING, now, endpoints=(), reason="no ready endpoint; waiting for one"
            )
        if not (new.phase is Phase.DRAINING or (new.phase is Phase.PARKED and new.parking)):
            self.before = None  # the drain or park is over, one way or the other
        self.cell.replace(new)
        if old.phase is not new.phase:
            log.info("%s: %s -> %s (%s)", self.name, old.phase.value, new.phase.value, new.reason)
            self._show(new.phase)
        return new


def rows() -> list[tuple[str, str, str]]:
    """The table as (phase, event, next phase) in its own order: docs/architecture.md."""
    return [
        (phase.value, event.value, nxt if isinstance(nxt, str) else nxt.value)
        for (phase, event), nxt in TABLE.items()
    ]
