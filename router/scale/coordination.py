"""What a target's lifecycle needs from the other warmgate replicas, and what it offers them.

The lifecycle knows neither how the others are found nor how they are asked: ``router/cluster``
implements :class:`Others` (the Lease and the others' admin listeners, docs/replicas.md) and calls
each lifecycle back as a :class:`Fenceable`; the wiring (``router/app.py``) hands one to the other.
A lifecycle with no :class:`Others` is the only replica: its idleness is its own, and it releases.
"""

from __future__ import annotations

from typing import Protocol


class Fenceable(Protocol):
    """What a target's lifecycle offers the leader of another replica."""

    def fence(self, until: float, leader: str, needed: float | None = None) -> str | None:
        """Hold new requests until ``until`` for a release (or park) ``leader`` is about to
        make; ``None`` if done, else why not (this replica is active, or idle for less than
        ``needed`` seconds; ``None``: the release's ``idle_after``)."""
        ...

    def unfence(self, parked: bool = False) -> None:
        """The leader called the release off: serve again; or it parked the target
        (``parked``): parked here too."""
        ...


class Others(Protocol):
    """The other warmgate replicas, as one target's lifecycle needs them."""

    @property
    def fence_timeout(self) -> float:
        """Seconds a fence holds the others' new requests at most; a release is stored within
        half of it or given up."""
        ...

    @property
    def poll_interval(self) -> float:
        """Seconds between two reads of the others: a release put off is not tried sooner."""
        ...

    def idle_since(self, target: str) -> float | None:
        """The target's idleness on every replica together: ``None`` while any one is active
        (or cannot be heard); else the latest instant from which all were idle."""
        ...

    def wanted(self, target: str) -> bool:
        """Requests are held for the target, or its start was asked for, on some replica (a
        GPU pool makes room for it; docs/pools.md)."""
        ...

    def leading(self) -> bool:
        """This replica decides releases right now (it may stop doing so at any await)."""
        ...

    async def confirm_leading(self) -> bool:
        """The leadership renewed now: True if it is still held, so a stop may follow at once."""
        ...

    async def fence_others(self, target: str, needed: float | None = None) -> str | None:
        """Ask every other replica to hold new requests for ``target`` (each idle for at least
        ``needed`` seconds; ``None``: ``idle_after``): ``None`` when all did, else why not (the
        ones fenced are let go again)."""
        ...

    async def grant(self, pool: str, target: str) -> str | None:
        """A seat of ``pool`` for ``target`` to start or wake in, granted by the leader, so two
        replicas never fill one seat at once: ``None`` when granted, else what it waits for."""
        ...

    async def parked_others(self, target: str) -> None:
        """Tell every other replica (fenced for it) that the leader parked ``target``."""
        ...

    async def unfence_others(self, target: str) -> None:
        """Call a fence off on every other replica."""
        ...

    def add_fenceable(self, target: str, fenceable: Fenceable) -> None:
        """``fenceable`` answers the leader's fences for ``target`` on this replica."""
        ...
