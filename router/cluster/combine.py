"""What each warmgate replica says of each target, and how their words combine: pure, no I/O.

A target is idle only when every replica says so, and a replica that does not answer counts as
active until ``peer_grace`` after it last did (docs/replicas.md). Words travel between replicas
as JSON with times relative to the sender's and the receiver's now: two loop clocks share
nothing but their rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from backends.membership import Peer
from backends.outside import Refused, count, taken
from backends.units import MAX_DURATION
from router.scale.state import Phase
from router.scale.targets import TargetRuntime


@dataclass(frozen=True, slots=True)
class Word:
    """One target on one replica, as that replica last said, in this replica's loop time."""

    held: int = 0
    in_flight: int = 0
    idle_since: float | None = None
    """``None``: active (requests in flight, a busy engine, a stream with traffic)."""
    wanted_until: float = -math.inf
    phase: str = "cold"

    @property
    def active(self) -> bool:
        """Requests held or in flight, activity within its window, or a start under way (a
        replica that probes the workload it found running would refuse a fence)."""
        return (
            self.idle_since is None
            or self.held > 0
            or self.in_flight > 0
            or self.phase == "starting"
        )


@dataclass
class PeerRecord:
    peer: Peer
    first_seen: float
    last_contact: float | None = None
    """Loop time of the last answer."""
    words: dict[str, Word] = field(default_factory=dict)
    reachable: bool = False
    """The last read was answered."""
    listed: bool = True
    """Still among the Service's endpoints."""
    error: str | None = None
    leader: bool = False
    """It said it holds the Lease, when it last answered."""

    @property
    def heard_at(self) -> float:
        """When it last answered, or (never yet) when it was first listed."""
        return self.last_contact if self.last_contact is not None else self.first_seen


@dataclass(frozen=True, slots=True)
class Combined:
    """A target over all replicas."""

    idle_since: float | None
    """``None``: some replica is active, or cannot be heard and its grace has not run out."""
    held: int
    in_flight: int
    wanted_until: float
    why_active: str = ""


def combine(
    own: Word, records: Iterable[PeerRecord], target: str, now: float, grace: float
) -> Combined:
    """This replica's word and the others': idle only when every replica is idle; a replica
    not heard for up to ``grace`` seconds counts as active; past that, its last word stands (if
    it was active then, it counts as idle only from when it was last heard)."""
    idle_since, held, in_flight, wanted = own.idle_since, own.held, own.in_flight, own.wanted_until
    why = "this replica is active" if own.active else ""
    for record in records:
        contact = record.heard_at
        word = record.words.get(target)
        silent = not record.reachable or record.last_contact is None
        if word is not None:
            held += word.held
            in_flight += word.in_flight
            wanted = max(wanted, word.wanted_until)
        if silent and now - contact < grace:
            why = why or f"replica {record.peer.name} is not answering (grace {grace:g}s)"
            idle_since = None
            continue
        if word is None:
            if silent and idle_since is not None:
                idle_since = max(idle_since, contact)
            continue
        if word.active:
            if silent:  # gone long enough: active when last heard
                if idle_since is not None:
                    idle_since = max(idle_since, contact)
                continue
            why = why or f"replica {record.peer.name} is active"
            idle_since = None
        elif idle_since is not None and word.idle_since is not None:
            idle_since = max(idle_since, word.idle_since)
    return Combined(idle_since, held, in_flight, wanted, why)


def own_word(runtime: TargetRuntime) -> Word:
    activity = runtime.activity
    return Word(
        held=activity.held,
        in_flight=activity.in_flight,
        idle_since=activity.idle_since(runtime.spec.scaling.stream_activity_window),
        wanted_until=activity.wanted_until,
        phase=runtime.state.phase.value,
    )


def alone(runtime: TargetRuntime) -> Combined:
    """A target on this replica when it is the only one."""
    word = own_word(runtime)
    return Combined(word.idle_since, word.held, word.in_flight, word.wanted_until)


def word_to_json(word: Word, now: float) -> dict[str, Any]:
    """Times relative to now: two replicas' loop clocks share nothing but their rate."""
    return {
        "phase": word.phase,
        "held": word.held,
        "in_flight": word.in_flight,
        "idle_for": None if word.idle_since is None else round(now - word.idle_since, 3),
        "wanted_for": round(max(0.0, word.wanted_until - now), 3),
    }


PHASES: Final = frozenset(phase.value for phase in Phase)


def _phase(value: object) -> str:
    """A phase a peer names: one of warmgate's, else its answer is no answer."""
    if value is None:
        return Phase.COLD.value
    if not isinstance(value, str) or value not in PHASES:
        raise Refused("phase")
    return value


def _count(data: Mapping[str, Any], field: str) -> int:
    value = data.get(field)
    taken = 0 if value is None else count(value)
    if taken is None:
        raise Refused(field)
    return taken


def word_from_json(data: Mapping[str, Any], now: float) -> Word:
    """A replica's word on one target; :class:`Refused` (a ``ValueError``: the whole answer is
    no answer) for a number out of its bounds: ``idle_for: 1e400`` would make the target idle
    since ever, and ``/replicas`` write ``Infinity``."""
    idle_for = data.get("idle_for")
    wanted = data.get("wanted_for")
    wanted_for = 0.0 if wanted is None else taken(wanted, "wanted_for", 0, MAX_DURATION)
    return Word(
        held=_count(data, "held"),
        in_flight=_count(data, "in_flight"),
        idle_since=None if idle_for is None else now - taken(idle_for, "idle_for", 0, MAX_DURATION),
        wanted_until=now + wanted_for if wanted_for > 0 else -math.inf,
        phase=_phase(data.get("phase")),
    )


RESIDENT_PHASES = frozenset({"starting", "ready", "draining"})
"""The phases in which a target holds its GPU on the replica that says so (a parked one holds
no weights; one parking or waking is counted where it happens)."""


def seat_for(target: str, capacity: int, holders: Mapping[str, str]) -> str | None:
    """Whether ``target`` may take a seat of a pool holding ``capacity`` targets at once, whose
    seats ``holders`` hold now (target -> where: ``here``, ``on <replica>``, ``granted``):
    ``None`` when it may (it holds one already, or one is free), else what it waits for."""
    if target in holders:
        return None
    if len(holders) < capacity:
        return None
    held = ", ".join(f"{name} ({where})" for name, where in sorted(holders.items()))
    return f"waiting for the GPU: held by {held}"


def combined_to_json(c: Combined, now: float) -> dict[str, Any]:
    return {
        "idle_for": None if c.idle_since is None else round(now - c.idle_since, 3),
        "held": c.held,
        "in_flight": c.in_flight,
        "active_because": c.why_active or None,
    }
