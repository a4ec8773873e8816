"""Where an exchange and the connection that carries it meet: each side's view of the other.
router.http.h1.connection.Connection is a :class:`Carrier`, router.http.h1.exchange.Exchange a
:class:`Receiver`; neither module imports the other (router.http.h1.pool puts them together)."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Carrier(Protocol):
    """What an exchange (its request body, its response body) needs of its connection."""

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def lost(self) -> bool:
        """The connection is gone."""
        ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    async def drain(self) -> None:
        """Wait until the upstream has taken what was written; raises ``ConnectionBroken`` if
        the connection is gone."""
        ...

    def close(self) -> None:
        """Close it; the exchange hears of it (``connection_lost``)."""
        ...

    def discard(self) -> None:
        """The exchange is done with it, unfinished: closed without telling the exchange."""
        ...

    def release(self) -> None:
        """The exchange is done with it, complete: it may carry the next one."""
        ...

    def renew_read_buffer(self) -> None:
        """Read into a fresh buffer from now on: a client transport kept a view of the one
        read into, as it could not send all of it at once."""
        ...


class Receiver(Protocol):
    """What a connection needs of the exchange it carries: where reads and the end go."""

    @property
    def awaiting_head(self) -> bool:
        """No response head yet: read a little (a large body can wait in the socket)."""
        ...

    def received(self, buffer: bytearray, nbytes: int) -> None:
        """``buffer[:nbytes]`` arrived; consumed (or copied) before this returns."""
        ...

    def eof_received(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: closed (``exc`` None: after ``eof_received``, or closed
        here) or reset."""
        ...
