"""Whose turn it is on a GPU pool: a pure function of (the pool's members as they are now, its
config, now) -> a :class:`Plan`. No I/O and no awaits.

A pool holds ``capacity`` targets resident at once (starting, ready, draining, or parking and
waking); a parked target does not count. A target that must start or wake while the pool is full
displaces a resident one that has been idle for at least ``yield_after``: the lowest priority
first, then the longest idle; parked when it can be, else stopped. Work in flight is never cut:
with nothing displaceable, the newcomer waits until something is (docs/pools.md).

Every member's lifecycle computes the same plan from the same snapshot: the waiting target learns
that it goes or what it waits for, the chosen resident that it makes room.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from router.scale.deadline import idle_reached

How = Literal["park", "stop"]


@dataclass(frozen=True, slots=True)
class Member:
    """One target of a pool as it is now."""

    name: str
    priority: int = 0
    resident: bool = False
    """Holding its GPU: starting, ready, draining, or parking or waking."""
    ready: bool = False
    """Ready (only a ready target is displaced)."""
    idle_since: float | None = None
    """Loop time since which it is idle (on every replica); ``None`` while active."""
    held: int = 0
    wants: bool = False
    """Not resident, and a request waits for it (held, or a start asked for)."""
    waiting_since: float = math.inf
    """Since when it wants its turn (first come, first served among equal priorities)."""
    can_park: bool = False
    leaving: bool = False
    """Being parked or stopped: resident still, its seat frees soon."""
    doing: str = ""
    """What it does now, in a few words (``rendering``, ``starting``, ``serving 2 requests``)."""

    def displaceable(self, yield_after: float, now: float) -> bool:
        return (
            self.resident
            and self.ready
            and self.held == 0
            and self.idle_since is not None
            and idle_reached(now, self.idle_since, yield_after)
        )


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a member that wants its turn does not get it yet."""

    reason: str
    """For people: ``waiting for the GPU: wan2gp is rendering``."""
    victim: str = ""
    """The resident that makes room for it (being parked or stopped); empty: none can yet."""
    until: float = math.inf
    """Loop time at which a resident becomes displaceable (look again then)."""


@dataclass(frozen=True, slots=True)
class Plan:
    go: frozenset[str] = frozenset()
    """Members that may start or wake now."""
    displace: dict[str, tuple[str, How]] = field(default_factory=dict)
    """Resident -> (the member it makes room for, how: parked or stopped)."""
    waiting: dict[str, Wait] = field(default_factory=dict)
    """Members that want their turn and wait, and what for."""

    def turn(self, name: str) -> Wait | None:
        """``None``: ``name`` may go (or does not wait); else what it waits for."""
        return self.waiting.get(name)


class Seats(Protocol):
    """A GPU pool as one of its targets sees it (the wiring's
    :class:`router.scale.pool_runtime.PoolRuntime`)."""

    @property
    def name(self) -> str: ...

    @property
    def yield_after(self) -> float:
        """Seconds a resident must be idle before it is displaced."""
        ...

    @property
    def capacity(self) -> int:
        """Targets resident at once."""
        ...

    def plan(self) -> Plan:
        """The pool's plan now."""
        ...

    def wait_if_wanted(self, target: str) -> Wait | None:
        """What a start or wake of ``target`` would wait for if it were asked now (``None``:
        it would go, possibly after displacing an idle target)."""
        ...

    def poke(self) -> None:
        """Something changed for the pool: every member's lifecycle looks again."""
        ...


def _order_waiters(members: Iterable[Member]) -> list[Member]:
    waiters = [m for m in members if m.wants and not m.resident]
    return sorted(waiters, key=lambda m: (-m.priority, m.waiting_since, m.name))


def _order_victims(members: Iterable[Member], yield_after: float, now: float) -> list[Member]:
    """Displaceable residents, the first to go first: lowest priority, then longest idle."""
    ready = [m for m in members if m.displaceable(yield_after, now)]
    return sorted(ready, key=lambda m: (m.priority, m.idle_since or 0.0, m.name))


def _busy_words(residents: list[Member]) -> str:
    if not residents:
        return "the GPU"
    shown = [f"{m.name} is {m.doing or 'busy'}" for m in residents[:3]]
    more = f" (and {len(residents) - 3} more)" if len(residents) > 3 else ""
    return ", ".join(shown) + more


def plan(
    members: Iterable[Member], capacity: int, yield_after: float, now: float, pool: str = ""
) -> Plan:
    """Who goes, who makes room for whom, and who waits for what. A resident that is leaving
    already (parking, draining) still counts against the capacity; the first waiter in line
    waits for its seat instead of displacing another."""
    members = list(members)
    residents = [m for m in members if m.resident]
    free = capacity - len(residents)
    waiters = _order_waiters(members)
    victims = _order_victims(members, yield_after, now)
    leaving = [m for m in residents if m.leaving]
    go: set[str] = set()
    displace: dict[str, tuple[str, How]] = {}
    waiting: dict[str, Wait] = {}
    where = f" ({pool})" if pool else ""
    for waiter in waiters:
        if free > 0:
            go.add(waiter.name)
            free -= 1
            continue
        if leaving:  # a displacement under way frees a seat for the first in line
            gone = leaving.pop(0)
            reason = f"waiting for the GPU{where}: {gone.name} is {gone.doing or 'leaving'}"
            waiting[waiter.name] = Wait(reason, victim=gone.name)
            continue
        if victims:
            victim = victims.pop(0)
            how: How = "park" if victim.can_park else "stop"
            displace[victim.name] = (waiter.name, how)
            word = "parked" if how == "park" else "stopped"
            reason = f"waiting for the GPU{where}: {victim.name} is being {word} to make room"
            waiting[waiter.name] = Wait(reason, victim=victim.name)
            continue
        busy = [m for m in residents if m.name not in displace and not m.leaving]
        soonest = min(
            (m.idle_since + yield_after for m in busy if m.ready and m.idle_since is not None),
            default=math.inf,
        )
        reason = f"waiting for the GPU{where}: {_busy_words(busy)}"
        waiting[waiter.name] = Wait(reason, until=soonest)
    return Plan(frozenset(go), displace, waiting)
