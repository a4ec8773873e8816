"""Several warmgate replicas, as the router sees them: which others there are (:class:`Peer`)
and whether this one leads (:class:`Membership`). The Kubernetes backend offers one
(:mod:`backends.kubernetes.membership`: a Lease and the replicas' pods); one warmgate alone has
none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Peer:
    """Another warmgate replica: its name (the pod's) and its admin listener's base URL."""

    name: str
    url: str


class Membership(Protocol):
    """Which other warmgate replicas there are, and whether this one leads (decides releases).

    ``open`` lists before it returns; a cluster that cannot be reached is reported by
    ``problems`` and retried in the background (never an error: serving goes on)."""

    @property
    def identity(self) -> str:
        """This replica's name, as the others see it."""
        ...

    async def open(self, on_change: Callable[[], None]) -> None:
        """Start watching; ``on_change`` is called when the peers or the leadership change."""
        ...

    def peers(self) -> tuple[Peer, ...]:
        """The other replicas now listed (never this one)."""
        ...

    def leading(self) -> bool:
        """This replica holds the leadership right now (and may lose it at any await)."""
        ...

    async def confirm(self) -> bool:
        """Renew the leadership now: True if it is still held, so an irreversible step may
        follow at once."""
        ...

    def problems(self) -> list[str]:
        """Why the view of the others or of the leadership may be stale right now."""
        ...

    async def close(self) -> None:
        """Stop watching; hand the leadership over at once if it is held."""
        ...
